"""The CLI's parser: a version, help for every option, choices where there are some, the exit
statuses in its help; and its completion script in a real bash."""

import shutil
import subprocess
import sys

import pytest

from runledger_client import __version__
from runledger_client._cli_args import subcommands
from runledger_client.cli import main, parser


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out == f"runledger {__version__}\n"


def test_every_option_of_every_command_has_help_and_the_help_says_the_exit_statuses() -> None:
    top = parser()
    for name, sub in [("", top), *subcommands(top).items()]:
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


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_bash_completion_completes_commands_options_and_choices() -> None:
    made = subprocess.run(
        [sys.executable, "-m", "runledger_client", "completion", "bash"], capture_output=True, text=True, timeout=30
    )
    assert made.returncode == 0, made.stderr
    script = made.stdout
    assert complete(script, "runledger", "wa") == ["watch", "wait"]
    assert complete(script, "runledger", "--url", "http://x", "ev") == ["events"]
    assert complete(script, "runledger", "watch", "ID", "--ex") == ["--exit-status"]
    assert complete(script, "runledger", "list", "-o", "j") == ["json", "jsonl"]
    assert complete(script, "runledger", "stop", "--code", "p") == ["policy"]
    assert {"bash", "zsh", "fish"} <= set(complete(script, "runledger", "completion", ""))
    for shell in ("zsh", "fish"):
        other = subprocess.run(
            [sys.executable, "-m", "runledger_client", "completion", shell], capture_output=True, text=True, timeout=30
        )
        assert other.returncode == 0 and "runledger" in other.stdout
