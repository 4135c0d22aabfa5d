"""`runledger completion bash|zsh|fish`: completion scripts made from the parser itself, so every
command, option and choice the CLI has is completed, and nothing it lacks (no dependency beyond
the standard library; zsh loads the bash function through its bashcompinit)."""

from __future__ import annotations

import argparse
import shlex

from runledger_client._cli_args import every_command, subcommands


def _options(sub: argparse.ArgumentParser) -> list[str]:
    return sorted({flag for action in sub._actions for flag in action.option_strings})


def _choices(top: argparse.ArgumentParser) -> dict[str, list[str]]:
    """Each option that takes one of a set of values, with them."""
    found: dict[str, list[str]] = {}
    for sub in [top, *every_command(top).values()]:
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
            for sub in [top, *every_command(top).values()]
            for action in sub._actions
            if action.option_strings and action.nargs != 0
            for flag in action.option_strings
        }
    )


def _groups(top: argparse.ArgumentParser) -> dict[str, list[str]]:
    """The commands that have commands of their own (`webhooks`), with them."""
    return {name: list(inner) for name, sub in subcommands(top).items() if (inner := subcommands(sub))}


def bash(top: argparse.ArgumentParser) -> str:
    subs = subcommands(top)
    cases = "\n".join(
        f"        {shlex.quote(name)}) words={shlex.quote(' '.join(_options(sub) + _positional_choices(sub)))} ;;"
        for name, sub in every_command(top).items()
    )
    # In a group, its command is the first word after it that is not an option.
    inner = "\n".join(
        f'                {group}) [[ " {" ".join(names)} " == *" $word "* ]] && command="$command $word" ;;'
        for group, names in _groups(top).items()
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
        if [[ -z "$command" ]]; then
            if [[ " $commands " == *" $word "* ]]; then command="$word"; fi
            case "$command" in {"|".join(_groups(top)) or "''"}) ;; "") ;; *) break ;; esac
        elif [[ "$word" != -* ]]; then
            case "$command" in
{inner}
            esac
            break
        fi
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


def _fish_offers(lines: list[str], condition: str, subs: dict[str, argparse.ArgumentParser]) -> None:
    """Offer the commands `subs` (with their descriptions) where `condition` holds."""
    for name, sub in subs.items():
        lines.append(
            f"complete -c runledger -n {shlex.quote(condition)} -a {name} -d {shlex.quote(sub.description or '')}"
        )


def fish(top: argparse.ArgumentParser) -> str:
    subs = subcommands(top)
    groups = _groups(top)
    lines = ["# runledger completion for fish: runledger completion fish | source", "complete -c runledger -f"]
    names = " ".join(subs)
    _fish_offers(lines, f"not __fish_seen_subcommand_from {names}", subs)
    conditions = {}
    for name in subs:
        # A group's commands may share a name with a top-level one (`webhooks list`, `list`).
        others = [group for group in groups if group != name]
        conditions[name] = f"__fish_seen_subcommand_from {name}" + "".join(
            f"; and not __fish_seen_subcommand_from {group}" for group in others
        )
    for group, inner in groups.items():
        seen = f"__fish_seen_subcommand_from {group}"
        _fish_offers(lines, f"{seen}; and not __fish_seen_subcommand_from {' '.join(inner)}", subcommands(subs[group]))
        for leaf in inner:
            conditions[f"{group} {leaf}"] = f"{seen}; and __fish_seen_subcommand_from {leaf}"
    for name, sub in every_command(top).items():
        condition = shlex.quote(conditions[name])
        for action in sub._actions:
            if not action.option_strings:
                if action.choices is not None and name not in groups:
                    values = " ".join(str(c) for c in action.choices)
                    lines.append(f"complete -c runledger -n {condition} -a '{values}'")
                continue
            spec = " ".join(
                f"-l {flag[2:]}" if flag.startswith("--") else f"-s {flag[1:]}" for flag in action.option_strings
            )
            extra = " -r" if action.nargs != 0 else ""
            if action.choices is not None:
                extra += " -a " + shlex.quote(" ".join(str(c) for c in action.choices))
            help = shlex.quote((action.help or "").replace("%%", "%"))
            lines.append(f"complete -c runledger -n {condition} {spec}{extra} -d {help}")
    return "\n".join(lines) + "\n"


SCRIPTS = {"bash": bash, "zsh": zsh, "fish": fish}
