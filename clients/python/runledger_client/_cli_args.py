"""The `runledger` command's arguments: every command, option, choice and help text, in one parser
(docs/reference/cli.md and the shell completions are made from it)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any, TypeVar

from runledger_client._core import __version__

if TYPE_CHECKING:
    from runledger_client._output import Output
    from runledger_client.client import Client

# What the exit statuses mean (also in `runledger --help` and docs/reference/cli.md).
OK, REFUSED, USAGE_ERROR, UNREACHABLE = 0, 1, 2, 3
# `watch`/`wait --exit-status`: the run's outcome.
EXIT_BY_STATUS = {"completed": OK, "failed": 4, "cancelled": 5, "stopped": 6}

EXIT_STATUSES = """exit status:
  0  success (a cancel of a run already cancelled included; watch and wait: the run ended)
  1  the server refused (the error on stderr; a refused command prints the run's committed status)
  2  usage error: a bad argument, no URL or token, an unreadable token or config file
  3  the server could not be reached (after the client's retries, within seconds)
  with --exit-status, watch and wait exit with the run's outcome:
  0  completed   4  failed   5  cancelled   6  stopped"""

STATUSES = ("queued", "running", "waiting", "completed", "failed", "cancelled", "stopped")
OUTPUTS = ("text", "json", "jsonl")
STOP_CODES = ("staff", "policy", "budget_exhausted", "deadline_exceeded")
SHELLS = ("bash", "zsh", "fish")
# A schedule's overlap policies (runs/models/schedules.py Overlap; the client's tests compare the two).
OVERLAPS = ("skip", "buffer_one", "allow_all", "cancel_other")
# What a webhook endpoint may be told (runs/events.py WEBHOOK_EVENTS; the client's tests compare the two).
WEBHOOK_EVENTS = (
    "run.completed",
    "run.failed",
    "run.cancelled",
    "run.stopped",
    "run.waiting",
    "schedule.skipped",
    "schedule.failed",
)

T = TypeVar("T")


def given(options: dict[str, Any]) -> dict[str, Any]:
    """The options a command was given: those not None."""
    return {k: v for k, v in options.items() if v is not None}


def given_args(args: argparse.Namespace, *names: str, **more: Any) -> dict[str, Any]:
    """The arguments `names` (each parsed under the API's name for it) and the values `more`, those
    a command was given."""
    return given({name: getattr(args, name) for name in names} | more)


def at_most(items: Iterable[T], limit: int) -> Iterator[T]:
    """`--limit N`: the first N of `items` (0: all), none fetched after the last shown."""
    return islice(items, max(limit, 0) if limit else None)


def deleting(key: str, delete: Callable[[Client, str], None]) -> Callable[[Client, argparse.Namespace, Output], int]:
    """A `… delete` command: `delete` what the argument `key` names, then say so (`Output.deleted`)."""

    def command(client: Client, args: argparse.Namespace, out: Output) -> int:
        value = getattr(args, key)
        delete(client, value)
        out.deleted(key, value)
        return OK

    return command


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None


def _json_object(text: str) -> dict[str, Any]:
    value = _json_value(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _pair(text: str) -> tuple[str, str]:
    """`key=value`: a metadata label (the value may hold "=" too)."""
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError("must be KEY=VALUE")
    return key, value


def _seq(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError("must be an integer >= 0")
    return int(text)


# A token's lifetime as `manage.py create_token --expires` reads it: seconds per unit.
LIFETIME_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}


def _lifetime(text: str) -> int:
    """`30d`, `12h`, `90m`, `2w`: seconds (the server says whether it is within its bounds)."""
    number, unit = text[:-1], text[-1:]
    if not number.isdigit() or unit not in LIFETIME_UNITS:
        raise argparse.ArgumentTypeError("a whole number and a unit, s m h d or w (30d, 12h)")
    return int(number) * LIFETIME_UNITS[unit]


def _seconds(text: str) -> int:
    """`90`, `30s`, `5m`, `1h`, `1d`: seconds (the server says whether it is long enough)."""
    if text.isdigit():
        return int(text)
    try:
        return _lifetime(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError("seconds, or a whole number and a unit, s m h d or w (30s, 5m)") from None


def _statuses(text: str) -> str:
    unknown = [item for item in text.split(",") if item not in STATUSES]
    if unknown:
        raise argparse.ArgumentTypeError(f"{', '.join(unknown)}: not a status ({', '.join(STATUSES)})")
    return text


STATUS_HELP = f"a status, or several as a comma list ({', '.join(STATUSES)})"
END_CODE_HELP = "an end code (cancelled_by_user, agent_error, policy, …), or several as a comma list"
WHERE_HELP = "runs with this metadata label; repeatable (all must match)"


def connection_options() -> argparse.ArgumentParser:
    """Options every command takes, before or after its name (SUPPRESS keeps a later default from
    overwriting an earlier value)."""
    options = argparse.ArgumentParser(add_help=False)
    group = options.add_argument_group("connection and output (before or after the command)")
    group.add_argument("--url", default=argparse.SUPPRESS, help="the server (else $RUNLEDGER_URL, else the profile's)")
    group.add_argument(
        "--token",
        default=argparse.SUPPRESS,
        help="an API token (else $RUNLEDGER_TOKEN); other users see it in ps: prefer --token-file",
    )
    group.add_argument(
        "--token-file",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help="read the API token from a file (else $RUNLEDGER_TOKEN_FILE, else the profile's; with none, it is "
        "asked for)",
    )
    group.add_argument(
        "--profile",
        default=argparse.SUPPRESS,
        metavar="NAME",
        help="a profile of ~/.config/runledger/config.toml (else $RUNLEDGER_PROFILE, else `default`)",
    )
    group.add_argument(
        "-o",
        "--output",
        default=argparse.SUPPRESS,
        choices=OUTPUTS,
        help="text for people (default); json, one JSON value; jsonl, one JSON value per line — the API's field names",
    )
    return options


def parser(handlers: dict[str, Callable[..., int]] | None = None) -> argparse.ArgumentParser:
    """The parser; `handlers` (command name → function) are set as each command's `handler`."""
    handlers = handlers or {}
    connection = connection_options()
    top = argparse.ArgumentParser(
        prog="runledger",
        description="Create, watch and command Runledger runs.",
        epilog=EXIT_STATUSES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[connection],
    )
    top.add_argument("--version", action="version", version=f"runledger {__version__}")
    commands = top.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="each with its own --help: runledger COMMAND --help"
    )

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return _command(commands, name, help, connection, handlers.get(name))

    create = command("create", "create a run; prints its id (-o json: the run)")
    create.add_argument("agent", help="the agent's name (runledger agents lists them)")
    create.add_argument(
        "input", nargs="?", type=_json_object, default={}, metavar="INPUT_JSON", help="the run's input (default {})"
    )
    create.add_argument("--meta", type=_pair, action="append", metavar="KEY=VALUE", help="a metadata label; repeatable")
    create.add_argument("--parent", metavar="ID", help="the parent run's id")
    _budget_arguments(create)
    create.add_argument("--priority", type=int, help="among your own queued runs, higher first (-100..100; default 0)")
    create.add_argument("--start-after", metavar="ISO", help="not started before this ISO 8601 time")
    create.add_argument(
        "--idempotency-key", metavar="KEY", help="default: a new one (retries of this command reuse it)"
    )

    listing = command("list", "list the runs you can see, newest first")
    listing.add_argument("--status", type=_statuses, help=STATUS_HELP)
    listing.add_argument("--end-code", metavar="CODE", help=END_CODE_HELP)
    listing.add_argument("--where", type=_pair, action="append", metavar="KEY=VALUE", help=WHERE_HELP)
    listing.add_argument("--agent", metavar="NAME", help="runs of this agent")
    listing.add_argument("--parent", metavar="ID", help="the children of this run")
    listing.add_argument("--schedule", metavar="ID", help="the runs this schedule created")
    listing.add_argument("--limit", type=int, default=50, metavar="N", help="at most N runs (0: all); default 50")
    listing.add_argument("--jsonl", action="store_true", help="the same as -o jsonl")

    show = command("show", "show a run (-o json: the run's JSON)")
    show.add_argument("id", help="the run's id")

    watch = command("watch", "follow a run's events until it ends, resuming after any drop; prints its text")
    watch.add_argument("id", help="the run's id")
    watch.add_argument("--after-seq", type=_seq, default=0, metavar="N", help="start after event N (default 0)")
    watch.add_argument("--jsonl", action="store_true", help="the same as -o jsonl: each event object, one per line")
    _exit_status_argument(watch)

    events = command("events", "print a run's events so far (the stored log, page by page), without following")
    events.add_argument("id", help="the run's id")
    events.add_argument("--after-seq", type=_seq, default=0, metavar="N", help="start after event N (default 0)")
    events.add_argument("--limit", type=int, default=0, metavar="N", help="at most N events (0: all; the default)")

    wait = command("wait", "wait until a run ends (following its stream); prints its status (-o json: the run)")
    wait.add_argument("id", help="the run's id")
    wait.add_argument(
        "--released", action="store_true", help="also until its worker has stopped executing it (attempt released)"
    )
    _exit_status_argument(wait)

    command("agents", "list the agents a run may name, with the event types of their own")

    cancel = command(
        "cancel",
        "cancel a run (a run already cancelled is a success), or every run a filter matches (--where …): "
        "asks first, showing how many; prints the count of each outcome",
    )
    cancel.add_argument("id", nargs="?", help="the run's id (or a filter instead)")
    cancel.add_argument("--note", default="", help="why, recorded with the cancel")
    _match_arguments(cancel)

    stop = command("stop", "stop a run, or every run a filter matches (--where …), as cancel (needs runs.stop_run)")
    stop.add_argument("id", nargs="?", help="the run's id (or a filter instead)")
    stop.add_argument("--reason", required=True, help="why, recorded as the run's end_reason")
    stop.add_argument("--code", choices=STOP_CODES, help="the end code (default staff)")
    _match_arguments(stop)

    pause = command("pause", "pause a run")
    pause.add_argument("id", help="the run's id")

    resume = command("resume", "resume a waiting run with its ticket")
    resume.add_argument("id", help="the run's id")
    resume.add_argument("--ticket", required=True, help="the run's resume_ticket (runledger show ID -o json)")
    resume.add_argument("--input", type=_json_value, metavar="JSON", help="the answer the run waits for")

    rerun = command("rerun", "run an ended run again, or fork it from an event; prints the new run's id")
    rerun.add_argument("id", help="the ended run's id")
    rerun.add_argument(
        "--from-seq", type=_seq, metavar="N", help="fork: continue from the original's agent events up to seq N"
    )
    rerun.add_argument("--input", type=_json_object, metavar="JSON", help="default: the original's")
    _budget_arguments(rerun)

    _webhooks_commands(
        command("webhooks", "your webhook endpoints: told when your runs end or wait"), connection, handlers
    )
    _tokens_commands(command("tokens", "your API tokens: issue, list, revoke"), connection, handlers)
    _schedules_commands(
        command("schedules", "your schedules: a run created at each due time of a cron or an interval"),
        connection,
        handlers,
    )

    completion = command("completion", 'print a shell completion script: eval "$(runledger completion bash)"')
    completion.add_argument("shell", choices=SHELLS, help="the shell")
    return top


def _command(
    commands: Any, name: str, help: str, connection: argparse.ArgumentParser, handler: Callable[..., int] | None
) -> argparse.ArgumentParser:
    """A command of `commands` (a parser's subparsers), with the connection options and its handler."""
    sub: argparse.ArgumentParser = commands.add_parser(
        name,
        help=help,
        description=help,
        parents=[connection],
        epilog=EXIT_STATUSES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if handler is not None:
        sub.set_defaults(handler=handler)
    return sub


def _group(
    group: argparse.ArgumentParser,
    name: str,
    connection: argparse.ArgumentParser,
    handlers: dict[str, Callable[..., int]],
) -> Callable[[str, str], argparse.ArgumentParser]:
    """A group of commands, `runledger NAME COMMAND`: what adds one of them (handlers `NAME <command>`)."""
    commands = group.add_subparsers(
        dest=f"{name}_command",
        required=True,
        metavar=f"{name.upper()}_COMMAND",
        help=f"each with its own --help: runledger {name} COMMAND --help",
    )

    def command(command_name: str, help: str) -> argparse.ArgumentParser:
        return _command(commands, command_name, help, connection, handlers.get(f"{name} {command_name}"))

    return command


def _tokens_commands(
    tokens: argparse.ArgumentParser, connection: argparse.ArgumentParser, handlers: dict[str, Callable[..., int]]
) -> None:
    """`runledger tokens COMMAND` (docs/design/api.md#tokens); handlers `tokens <name>`."""
    command = _group(tokens, "tokens", connection, handlers)
    create = command(
        "create",
        "issue a token; prints its key alone, shown only now (-o json: the token with its key). Issued with "
        "a token, it expires no later than that one and is revoked with it",
    )
    create.add_argument("name", help="its name, unique among yours: 1 to 64 of A-Z a-z 0-9 . _ -")
    create.add_argument("--expires", type=_lifetime, metavar="LIFETIME", help="e.g. 30d, 12h, 90m (default: never)")
    command("list", "list your tokens, oldest first: names, expiries, last use — never a key")
    delete = command("delete", 'revoke a token at once; prints "deleted NAME" (-o json: {"name", "deleted"})')
    delete.add_argument("name", help="the token's name")


def _schedules_commands(
    schedules: argparse.ArgumentParser, connection: argparse.ArgumentParser, handlers: dict[str, Callable[..., int]]
) -> None:
    """`runledger schedules COMMAND` (docs/design/schedules.md); handlers `schedules <name>`."""
    command = _group(schedules, "schedules", connection, handlers)

    create = command("create", "create a schedule; prints its id and next due time (-o json: the schedule)")
    create.add_argument("agent", help="the agent each run runs (runledger agents lists them)")
    create.add_argument(
        "input", nargs="?", type=_json_object, default={}, metavar="INPUT_JSON", help="each run's input (default {})"
    )
    timing = create.add_mutually_exclusive_group(required=True)
    timing.add_argument("--cron", metavar="EXPR", help='five fields or a macro, e.g. "0 9 * * 1-5", @daily')
    timing.add_argument(
        "--every", type=_seconds, metavar="INTERVAL", help="a fixed interval: seconds, or 30s, 5m, 1h, 1d"
    )
    create.add_argument("--timezone", metavar="ZONE", help="the cron's IANA time zone, e.g. Europe/Paris (default UTC)")
    create.add_argument(
        "--overlap", choices=OVERLAPS, help="what a due time does while the last run is live (default skip)"
    )
    create.add_argument(
        "--catchup",
        type=_seconds,
        metavar="WINDOW",
        help="after downtime, fire the due times missed within this window (default 0: only the latest)",
    )
    create.add_argument("--start-at", metavar="ISO", help="no due time before this ISO 8601 time")
    create.add_argument("--end-at", metavar="ISO", help="no due time after this ISO 8601 time")
    create.add_argument("--meta", type=_pair, action="append", metavar="KEY=VALUE", help="a label of each run")
    create.add_argument("--priority", type=int, help="each run's priority (-100..100; default 0)")

    listing = command("list", "list your schedules, newest first")
    listing.add_argument("--limit", type=int, default=50, metavar="N", help="at most N (0: all); default 50")

    for name, help in (
        ("show", "show a schedule (-o json: its JSON)"),
        ("pause", "pause a schedule: nothing fires until it is resumed; prints it"),
        ("resume", "resume a schedule from its next due time after now; prints it"),
        ("trigger", "create a run now, as a due time would (the overlap policy applies); prints the run's id"),
        ("delete", 'delete a schedule (its runs stay); prints "deleted ID" (-o json: {"id", "deleted"})'),
    ):
        command(name, help).add_argument("id", help="the schedule's id")

    backfill = command(
        "backfill", "create the runs of the due times in a past range that have none yet; prints their ids"
    )
    backfill.add_argument("id", help="the schedule's id")
    backfill.add_argument("--from", dest="start", required=True, metavar="ISO", help="the range's start (ISO 8601)")
    # Not --to: argparse would take it for an abbreviation of --token.
    backfill.add_argument(
        "--until", dest="end", required=True, metavar="ISO", help="the range's end, included (ISO 8601; not after now)"
    )
    backfill.add_argument("--max", type=int, required=True, metavar="N", help="at most N runs, the oldest due first")


def _webhooks_commands(
    webhooks: argparse.ArgumentParser, connection: argparse.ArgumentParser, handlers: dict[str, Callable[..., int]]
) -> None:
    """`runledger webhooks COMMAND` (docs/design/webhooks.md#endpoints); handlers `webhooks <name>`."""
    command = _group(webhooks, "webhooks", connection, handlers)

    create = command(
        "create", "register an endpoint; prints its id and its signing secret, shown only now (-o json: the endpoint)"
    )
    create.add_argument("endpoint_url", metavar="URL", help="where to POST: http(s), a public address")
    _webhook_arguments(create, required=True)

    command("list", "list your endpoints, oldest first")

    show = command("show", "show an endpoint (-o json: its JSON)")
    show.add_argument("id", help="the endpoint's id")

    update = command("update", "change an endpoint: what is given; prints it (-o json: its JSON)")
    update.add_argument("id", help="the endpoint's id")
    update.add_argument("--endpoint-url", metavar="URL", help="where to POST now: http(s), a public address")
    _webhook_arguments(update, required=False)
    enabled = update.add_mutually_exclusive_group()
    enabled.add_argument(
        "--enable",
        dest="enabled",
        action="store_const",
        const=True,
        help="send to it again (clears why Runledger disabled it, and its failures so far)",
    )
    enabled.add_argument("--disable", dest="enabled", action="store_const", const=False, help="send nothing to it")

    delete = command(
        "delete", 'delete an endpoint and its deliveries; prints "deleted ID" (-o json: {"id", "deleted"})'
    )
    delete.add_argument("id", help="the endpoint's id")

    rotate = command(
        "rotate-secret",
        "give an endpoint a new signing secret; prints it, shown only now (the old one signs too for a day)",
    )
    rotate.add_argument("id", help="the endpoint's id")

    deliveries = command("deliveries", "list an endpoint's notifications, newest first, with their status")
    deliveries.add_argument("id", help="the endpoint's id")
    deliveries.add_argument("--limit", type=int, default=50, metavar="N", help="at most N (0: all); default 50")


def _webhook_arguments(sub: argparse.ArgumentParser, *, required: bool) -> None:
    sub.add_argument(
        "--events",
        action="append",
        choices=WEBHOOK_EVENTS,
        required=required,
        metavar="EVENT",
        help=f"an event to be told of ({', '.join(WEBHOOK_EVENTS)}); repeatable"
        + ("" if required else "; replaces the endpoint's"),
    )
    sub.add_argument(
        "--where",
        type=_pair,
        action="append",
        metavar="KEY=VALUE",
        help="only runs with this metadata label; repeatable (all must match)"
        + ("" if required else "; replaces the endpoint's"),
    )
    sub.add_argument(
        "--all-runs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="every owner's runs, not only yours (needs runs.view_run)",
    )


def _budget_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--max-steps", type=int, metavar="N", help="at most N agent steps")
    sub.add_argument("--max-events", type=int, metavar="N", help="at most N events")
    sub.add_argument("--max-attempts", type=int, metavar="N", help="at most N attempts (requeues after a lost worker)")
    sub.add_argument("--deadline", metavar="ISO", help="an absolute ISO 8601 time (default: the server's)")


def _exit_status_argument(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--exit-status",
        action="store_true",
        help="exit with the run's outcome: 0 completed, 4 failed, 5 cancelled, 6 stopped",
    )


def _match_arguments(sub: argparse.ArgumentParser) -> None:
    """A command on every run that matches, instead of one run (docs/design/commands.md#bulk-commands)."""
    group = sub.add_argument_group("every run that matches (instead of an id)")
    group.add_argument("--where", type=_pair, action="append", metavar="KEY=VALUE", help=WHERE_HELP)
    group.add_argument("--status", type=_statuses, help=STATUS_HELP)
    group.add_argument("--agent", metavar="NAME", help="runs of this agent")
    group.add_argument("--end-code", metavar="CODE", help=END_CODE_HELP)
    group.add_argument("--schedule", metavar="ID", help="the runs this schedule created")
    group.add_argument(
        "--max", type=int, metavar="N", help="refuse (do nothing) if more than N match; default: the count confirmed"
    )
    group.add_argument("--yes", action="store_true", help="do not ask (with --max: do not even count first)")


def subcommands(top: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """A parser's commands (`runledger`'s, or `runledger webhooks`')."""
    for action in top._subparsers._group_actions if top._subparsers else []:
        choices = getattr(action, "choices", None)
        if isinstance(choices, dict):
            return dict(choices)
    return {}


def every_command(top: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every command, a group's own ones as `webhooks create`, after the group."""
    found: dict[str, argparse.ArgumentParser] = {}
    for name, sub in subcommands(top).items():
        found[name] = sub
        found.update({f"{name} {inner}": leaf for inner, leaf in subcommands(sub).items()})
    return found
