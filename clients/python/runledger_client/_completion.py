"""`runledger completion bash|zsh|fish`: completion scripts made from the parser itself, so every
command, option and choice the CLI has is completed, and nothing it lacks (no dependency beyond
the standard library; zsh loads the bash function through its bashcompinit)."""

from __future__ import annotations

import argparse
import shlex

from runledger_client._cli_args import subcommands


def _options(sub: argparse.ArgumentParser) -> list[str]:
    return sorted({flag for action in sub._actions for flag in action.option_strings})


def _choices(top: argparse.ArgumentParser) -> dict[str, list[str]]:
    """Each option that takes one of a set of values, with them."""
    found: dict[str, list[str]] = {}
    for sub in [top, *subcommands(top).values()]:
        for action in sub._actions:
            if action.option_strings and action.choices is not None:
                for flag in action.option_strings:
                    found[flag] = [str(choice) for choice in action.choices]
    return found


def _positional_choices(sub: argparse.ArgumentParser) -> list[str]:
    return [str(c) for a in sub._actions if not a.option_strings and a.choices is not None for c in a.choices]


def _valued(top: argparse.ArgumentParser) -> list[str]:
    """The options that take a value (what follows them is no command)."""
    return sorted(
        {
            flag
            for sub in [top, *subcommands(top).values()]
            for action in sub._actions
            if action.option_strings and action.nargs != 0
            for flag in action.option_strings
        }
    )


def bash(top: argparse.ArgumentParser) -> str:
    subs = subcommands(top)
    cases = "\n".join(
        f"        {name}) words={shlex.quote(' '.join(_options(sub) + _positional_choices(sub)))} ;;"
        for name, sub in subs.items()
    )
    values = "\n".join(
        f'        {flag}) COMPREPLY=($(compgen -W {shlex.quote(" ".join(choices))} -- "$cur")); return ;;'
        for flag, choices in _choices(top).items()
    )
    return f"""# runledger completion for bash: eval "$(runledger completion bash)" (e.g. in ~/.bashrc)
_runledger() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    local commands={shlex.quote(" ".join(subs))}
    local valued={shlex.quote(" ".join(_valued(top)))}
    local command="" i word words
    case "$prev" in
{values}
    esac
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${{COMP_WORDS[i]}}"
        if [[ " $valued " == *" ${{COMP_WORDS[i-1]}} "* && $i -gt 1 ]]; then continue; fi
        if [[ " $commands " == *" $word "* ]]; then command="$word"; break; fi
    done
    case "$command" in
        "") if [[ "$cur" == -* ]]; then words={shlex.quote(" ".join(_options(top)))}; else words="$commands"; fi ;;
{cases}
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -F _runledger runledger
"""


def zsh(top: argparse.ArgumentParser) -> str:
    return (
        "#compdef runledger\n"
        '# runledger completion for zsh: eval "$(runledger completion zsh)" (e.g. in ~/.zshrc)\n'
        "autoload -U +X compinit && compinit\n"
        "autoload -U +X bashcompinit && bashcompinit\n" + bash(top)
    )


def fish(top: argparse.ArgumentParser) -> str:
    subs = subcommands(top)
    lines = ["# runledger completion for fish: runledger completion fish | source", "complete -c runledger -f"]
    names = " ".join(subs)
    for name, sub in subs.items():
        lines.append(
            f"complete -c runledger -n 'not __fish_seen_subcommand_from {names}' -a {name} "
            f"-d {shlex.quote(sub.description or '')}"
        )
        for action in sub._actions:
            if not action.option_strings:
                if action.choices is not None:
                    values = " ".join(str(c) for c in action.choices)
                    lines.append(f"complete -c runledger -n '__fish_seen_subcommand_from {name}' -a '{values}'")
                continue
            spec = " ".join(
                f"-l {flag[2:]}" if flag.startswith("--") else f"-s {flag[1:]}" for flag in action.option_strings
            )
            extra = " -r" if action.nargs != 0 else ""
            if action.choices is not None:
                extra += " -a " + shlex.quote(" ".join(str(c) for c in action.choices))
            help = shlex.quote((action.help or "").replace("%%", "%"))
            lines.append(f"complete -c runledger -n '__fish_seen_subcommand_from {name}' {spec}{extra} -d {help}")
    return "\n".join(lines) + "\n"


SCRIPTS = {"bash": bash, "zsh": zsh, "fish": fish}
