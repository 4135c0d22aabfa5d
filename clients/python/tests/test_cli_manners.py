"""The CLI's parser: a version, help for every option, choices where there are some, the exit
statuses in its help; and its completion script in a real bash."""

import shlex
import subprocess
import sys

import pytest

from runledger_client import __version__
from runledger_client._cli_args import every_command, subcommands
from runledger_client.cli import main, parser


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out == f"runledger {__version__}\n"


def test_every_option_of_every_command_has_help_and_the_help_says_the_exit_statuses() -> None:
    top = parser()
    for name, sub in [("", top), *every_command(top).items()]:
        for action in sub._actions:
            assert action.help, (name, action.dest)
        assert "3  the server could not be reached" in sub.format_help(), name
        assert "4  failed   5  cancelled   6  stopped" in sub.format_help(), name
    output = next(a for a in subcommands(top)["list"]._actions if "--output" in a.option_strings)
    assert output.choices == ("text", "json", "jsonl")


def test_a_status_filter_outside_the_statuses_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["list", "--status", "queued,bogus"])
    assert exited.value.code == 2 and "bogus: not a status" in capsys.readouterr().err


def complete(script: str, *words: str) -> list[str]:
    """What bash completes for the command line `words` (the last one being typed)."""
    line = " ".join(f"'{w}'" for w in words)
    program = f"""{script}
complete -p runledger >/dev/null || exit 9
COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}
_runledger
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    done = subprocess.run(["bash", "--norc", "-c", program], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def script(shell: str) -> str:
    made = subprocess.run(
        [sys.executable, "-m", "runledger_client", "completion", shell], capture_output=True, text=True, timeout=30
    )
    assert made.returncode == 0, made.stderr
    return made.stdout


def test_the_bash_completion_completes_commands_options_and_choices() -> None:
    bash = script("bash")
    assert complete(bash, "runledger", "wa") == ["watch", "wait"]
    assert complete(bash, "runledger", "--url", "http://x", "ev") == ["events"]
    assert complete(bash, "runledger", "watch", "ID", "--ex") == ["--exit-status"]
    assert complete(bash, "runledger", "list", "-o", "j") == ["json", "jsonl"]
    assert complete(bash, "runledger", "stop", "--code", "p") == ["policy"]
    assert {"bash", "zsh", "fish"} <= set(complete(bash, "runledger", "completion", ""))
    # A group's commands, then each one's own options, not those of a top-level namesake.
    assert complete(bash, "runledger", "webhooks", "r") == ["rotate-secret"]
    assert complete(bash, "runledger", "webhooks", "--url", "http://x", "create", "U", "--ev") == ["--events"]
    assert complete(bash, "runledger", "webhooks", "create", "U", "--events", "run.c") == [
        "run.completed",
        "run.cancelled",
    ]
    assert complete(bash, "runledger", "webhooks", "list", "--st") == []
    assert complete(bash, "runledger", "webhooks", "update", "ID", "--en") == ["--enable", "--endpoint-url"]


def zsh_candidates(zsh: str, *words: str) -> list[str]:
    """What the function zsh registered for `runledger` offers for `words` (the last one being
    typed), called as zsh's _bash_complete calls it (arrays from 0); zsh's completion then keeps
    those that start with the word typed, as it does for every bash-style completion."""
    line = " ".join(f"'{w}'" for w in words)
    program = f"""{zsh}
[[ ${{_comps[runledger]}} == '_bash_complete -F _runledger' ]] || exit 9
setopt ksharrays
COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}
_runledger
print -l -- "${{COMPREPLY[@]}}"
"""
    done = subprocess.run(["zsh", "-f", "-c", program], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return [word for word in done.stdout.split() if word.startswith(words[-1])]


def test_the_zsh_completion_registers_and_offers_commands_options_and_choices() -> None:
    zsh = script("zsh")
    assert zsh_candidates(zsh, "runledger", "wa") == ["watch", "wait"]
    assert zsh_candidates(zsh, "runledger", "watch", "ID", "--ex") == ["--exit-status"]
    assert zsh_candidates(zsh, "runledger", "list", "-o", "j") == ["json", "jsonl"]
    assert zsh_candidates(zsh, "runledger", "webhooks", "d") == ["delete", "deliveries"]
    assert zsh_candidates(zsh, "runledger", "webhooks", "create", "U", "--events", "run.s") == ["run.stopped"]


def fish_complete(fish: str, line: str) -> list[str]:
    """What fish's own completion engine (`complete -C`) completes for `line`."""
    program = f"{fish}\ncomplete -C {shlex.quote(line)}"
    done = subprocess.run(["fish", "--no-config", "-c", program], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return [row.split("\t", 1)[0] for row in done.stdout.splitlines()]


def test_the_fish_completion_completes_commands_options_and_choices() -> None:
    fish = script("fish")
    assert sorted(fish_complete(fish, "runledger wa")) == ["wait", "watch"]
    assert fish_complete(fish, "runledger watch ID --ex") == ["--exit-status"]
    assert fish_complete(fish, "runledger list -o j") == ["json", "jsonl"]
    assert fish_complete(fish, "runledger webhooks ro") == ["rotate-secret"]
    assert fish_complete(fish, "runledger webhooks create U --events run.w") == ["run.waiting"]
    assert fish_complete(fish, "runledger webhooks list --st") == []
    assert fish_complete(fish, "runledger list --st") == ["--status"]
