"""`runledger`: the Runledger API from a shell.

Exit status: 0 on success (a cancel of a run already cancelled included; `watch` once the stream
ends at the run's terminal event), 1 when the server refuses or cannot be reached, 2 on a usage
error. Commands print the run's status on stdout — on a refused command the committed status (a
cancel that lost the race to completion prints `completed`) — and explain on stderr.

What agents write is not trusted: their text reaches the terminal without control sequences
(`printable`), which could otherwise move the cursor, rewrite what is shown, set the window's
title or, on some terminals, write to files or the clipboard.
"""

from __future__ import annotations

import argparse
import getpass
import ipaddress
import json
import os
import re
import stat
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO
from urllib.parse import urlsplit

from runledger_client.client import Client
from runledger_client.errors import APIError, Conflict, TransportError
from runledger_client.models import BulkResult, Event, Run

USAGE_ERROR = 2
REFUSED = 1


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


# Terminal control sequences, whole (ESC [ … final byte; ESC ] … BEL or ST; ESC P/X/^/_ … ST; ESC
# and what follows it), then any other C0 control but tab and newline, DEL, and the C1 controls
# (U+0080 to U+009F, which some terminals obey as 8-bit ESC sequences).
_CONTROL = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b[ -/]*[0-~]?"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)
# In JSON text the C0 controls are always escaped; DEL and C1 may come raw.
_RAW_IN_JSON = re.compile(r"[\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` without terminal control sequences: what an agent wrote, safe to show."""
    return _CONTROL.sub("", text)


def printable_json(text: str) -> str:
    """JSON text with DEL and C1 characters escaped (\\u009b): the same JSON value, safe to show."""
    return _RAW_IN_JSON.sub(lambda found: f"\\u{ord(found[0]):04x}", text)


# --- the commands: each takes the client and its arguments, and returns the exit status ---------


def _budgets(args: argparse.Namespace) -> dict[str, Any]:
    """The budgets and deadline a create or a rerun was given (None: not given)."""
    return {name: getattr(args, name) for name in ("max_steps", "max_events", "max_attempts", "deadline")}


def cmd_create(client: Client, args: argparse.Namespace) -> int:
    options = {
        "parent": args.parent,
        **_budgets(args),
        "metadata": dict(args.meta) if args.meta else None,
        "priority": args.priority,
        "start_after": args.start_after,
    }
    run = client.create(
        args.agent,
        args.input,
        idempotency_key=args.idempotency_key,
        **{k: v for k, v in options.items() if v is not None},
    )
    print(run.id)
    return 0


def cmd_list(client: Client, args: argparse.Namespace) -> int:
    filters = {
        "status": args.status,
        "end_code": args.end_code,
        "agent": args.agent,
        "parent": args.parent,
        "metadata": dict(args.where) if args.where else None,
    }
    runs = client.list(**{k: v for k, v in filters.items() if v is not None})
    for n, run in enumerate(runs):
        if args.limit and n >= args.limit:
            break
        if args.jsonl:
            print(json.dumps(run.data))
        else:
            print(f"{run.id}  {run.status:<9}  {run['agent']:<16}  {run['created_at']}")
    return 0


def cmd_show(client: Client, args: argparse.Namespace) -> int:
    print(json.dumps(client.get(args.id).data, indent=2))
    return 0


def cmd_watch(client: Client, args: argparse.Namespace) -> int:
    status = StatusLine(sys.stderr) if sys.stderr.isatty() else None
    out = sys.stdout
    text_ends_line = True
    for event in client.stream(args.id, after_seq=args.after_seq):
        if args.jsonl:
            out.write(printable_json(event.text) + "\n")
        elif event.type == "output.delta":
            text = printable(str(event.data.get("text", "")))
            out.write(text)
            text_ends_line = text.endswith("\n") if text else text_ends_line
        out.flush()
        if status is not None:
            status.show(event)
    if not args.jsonl and not text_ends_line:
        out.write("\n")
        out.flush()
    if status is not None:
        status.done()
    return 0


def cmd_cancel(client: Client, args: argparse.Namespace) -> int:
    filters = _match(args)
    if filters is None:
        return _status(client.cancel(args.id, note=args.note))
    limit = _confirmed(client, filters, args, "cancel")
    if limit is None:
        return REFUSED
    return _outcomes(client.cancel_where(max=limit, note=args.note, **filters))


def cmd_stop(client: Client, args: argparse.Namespace) -> int:
    filters = _match(args)
    if filters is None:
        return _status(client.stop(args.id, reason=args.reason, code=args.code))
    limit = _confirmed(client, filters, args, "stop")
    if limit is None:
        return REFUSED
    return _outcomes(client.stop_where(max=limit, reason=args.reason, code=args.code, **filters))


def _match(args: argparse.Namespace) -> dict[str, Any] | None:
    """The filter of `cancel`/`stop --where …` (None: the command is on the one run `id`)."""
    filters = {
        "metadata": dict(args.where) if args.where else None,
        "status": args.status,
        "agent": args.agent,
        "end_code": args.end_code,
    }
    given = {k: v for k, v in filters.items() if v is not None}
    if args.id is not None and (given or args.max is not None or args.yes):
        raise UsageError("give a run id, or a filter (--where, --status, --agent, --end-code), not both")
    if args.id is None and not given:
        raise UsageError("give a run id, or a filter: --where KEY=VALUE, --status, --agent or --end-code")
    return given if args.id is None else None


def _confirmed(client: Client, filters: dict[str, Any], args: argparse.Namespace, verb: str) -> int | None:
    """The `max` to send: --max, or the count the user confirms. None: not confirmed."""
    if args.yes and args.max is not None:
        return int(args.max)
    count = client.count_where(**filters)
    if count == 0:
        print("no run matches", file=sys.stderr)
        return 0
    if args.max is not None and count > args.max:
        print(f"runledger: refused: {count} runs match, more than --max {args.max}; nothing done", file=sys.stderr)
        return None
    if not args.yes:
        print(f"{count} runs match. {verb.capitalize()} them? [y/N] ", end="", file=sys.stderr, flush=True)
        try:
            answer = input()
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing done", file=sys.stderr)
            return None
    # No more than were confirmed: runs that match since are a refusal, not a surprise.
    return count if args.max is None else int(args.max)


def _outcomes(result: BulkResult) -> int:
    """`<outcome> <count>` on stdout, one line each (the ids are in the API's answer)."""
    for outcome, count in result.counts.items():
        print(f"{outcome} {count}")
    return 0


def cmd_pause(client: Client, args: argparse.Namespace) -> int:
    run = client.pause(args.id)
    if run.status == "running":
        print("pause requested: the worker parks the run at its next safe boundary", file=sys.stderr)
    return _status(run)


def cmd_resume(client: Client, args: argparse.Namespace) -> int:
    return _status(client.resume(args.id, ticket=args.ticket, input=args.input))


def cmd_rerun(client: Client, args: argparse.Namespace) -> int:
    overrides = {"input": args.input, **_budgets(args)}
    run = client.rerun(args.id, from_seq=args.from_seq, **{k: v for k, v in overrides.items() if v is not None})
    print(run.id)
    return 0


def _status(run: Run) -> int:
    print(run.status)
    return 0


class StatusLine:
    """`watch`'s live status on a terminal: one line on stderr, rewritten in place."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.last = ""

    def show(self, event: Event) -> None:
        self.last = f"seq {event.seq}  {printable(event.type)}"
        self.stream.write(f"\r\x1b[K[{self.last}]")
        self.stream.flush()

    def done(self) -> None:
        self.stream.write(f"\r\x1b[K[{self.last}: stream ended]\n")
        self.stream.flush()


# --- arguments ------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    # --url/--token are accepted before or after the command (SUPPRESS keeps a later default from
    # overwriting an earlier value).
    connection = argparse.ArgumentParser(add_help=False)
    connection.add_argument("--url", default=argparse.SUPPRESS, help="the server (or $RUNLEDGER_URL)")
    connection.add_argument(
        "--token", default=argparse.SUPPRESS, help="an API token (or $RUNLEDGER_TOKEN); other users see it in ps"
    )
    connection.add_argument(
        "--token-file",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help="read the API token from a file (or $RUNLEDGER_TOKEN_FILE); with none given, it is asked for",
    )
    top = argparse.ArgumentParser(
        prog="runledger", description="Create, watch and command Runledger runs.", parents=[connection]
    )
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, handler: Callable[[Client, argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help, parents=[connection])
        sub.set_defaults(handler=handler)
        return sub

    create = command("create", cmd_create, "create a run; prints its id")
    create.add_argument("agent")
    create.add_argument("input", nargs="?", type=_json_object, default={}, metavar="INPUT_JSON")
    create.add_argument("--meta", type=_pair, action="append", metavar="KEY=VALUE", help="a metadata label; repeatable")
    create.add_argument("--parent")
    create.add_argument("--max-steps", type=int)
    create.add_argument("--max-events", type=int)
    create.add_argument("--max-attempts", type=int)
    create.add_argument("--deadline", help="absolute ISO 8601 time")
    create.add_argument("--priority", type=int, help="among your own queued runs, higher first (-100..100; default 0)")
    create.add_argument("--start-after", metavar="ISO", help="not started before this ISO 8601 time")
    create.add_argument("--idempotency-key", help="default: a new one (retries of this command reuse it)")

    listing = command("list", cmd_list, "list the runs you can see, newest first")
    listing.add_argument("--status", help="a status, or several as a comma list: queued,running")
    listing.add_argument("--end-code", help="an end code, or several as a comma list")
    listing.add_argument(
        "--where", type=_pair, action="append", metavar="KEY=VALUE", help="runs with this metadata label; repeatable"
    )
    listing.add_argument("--agent")
    listing.add_argument("--parent")
    listing.add_argument("--limit", type=int, default=50, help="at most this many (0: all); default 50")
    listing.add_argument("--jsonl", action="store_true", help="each run's JSON, one per line")

    show = command("show", cmd_show, "print a run's JSON")
    show.add_argument("id")

    watch = command("watch", cmd_watch, "follow a run's events until it ends, resuming after any drop")
    watch.add_argument("id")
    watch.add_argument("--after-seq", type=_seq, default=0, metavar="N", help="start after event N")
    watch.add_argument("--jsonl", action="store_true", help="each event object as the API sends it, one per line")

    cancel = command(
        "cancel",
        cmd_cancel,
        "cancel a run (a run already cancelled is a success), or every run a filter matches (--where …): "
        "asks first, showing how many; prints the count of each outcome",
    )
    cancel.add_argument("id", nargs="?")
    cancel.add_argument("--note", default="")
    _match_arguments(cancel)

    stop = command(
        "stop", cmd_stop, "stop a run, or every run a filter matches (--where …), as cancel (needs runs.stop_run)"
    )
    stop.add_argument("id", nargs="?")
    stop.add_argument("--reason", required=True)
    stop.add_argument("--code", choices=["staff", "policy", "budget_exhausted", "deadline_exceeded"])
    _match_arguments(stop)

    pause = command("pause", cmd_pause, "pause a run")
    pause.add_argument("id")

    resume = command("resume", cmd_resume, "resume a waiting run with its ticket")
    resume.add_argument("id")
    resume.add_argument("--ticket", required=True)
    resume.add_argument("--input", type=_json_value, metavar="JSON")

    rerun = command("rerun", cmd_rerun, "run an ended run again, or fork it from an event; prints the new run's id")
    rerun.add_argument("id")
    rerun.add_argument(
        "--from-seq", type=_seq, metavar="N", help="fork: continue from the original's agent events up to seq N"
    )
    rerun.add_argument("--input", type=_json_object, metavar="JSON", help="default: the original's")
    rerun.add_argument("--max-steps", type=int)
    rerun.add_argument("--max-events", type=int)
    rerun.add_argument("--max-attempts", type=int)
    rerun.add_argument("--deadline", help="absolute ISO 8601 time (default: the server's, not the original's)")
    return top


def _match_arguments(sub: argparse.ArgumentParser) -> None:
    """A command on every run that matches, instead of one run (docs/design/commands.md#bulk-commands)."""
    group = sub.add_argument_group("every run that matches (instead of an id)")
    group.add_argument(
        "--where", type=_pair, action="append", metavar="KEY=VALUE", help="runs with this metadata label; repeatable"
    )
    group.add_argument("--status", help="a status, or several as a comma list: queued,running")
    group.add_argument("--agent")
    group.add_argument("--end-code", help="an end code, or several as a comma list")
    group.add_argument(
        "--max", type=int, metavar="N", help="refuse (do nothing) if more than N match; default: the count confirmed"
    )
    group.add_argument("--yes", action="store_true", help="do not ask (with --max: do not even count first)")


def _attached(argv: list[str]) -> list[str]:
    """`--ticket -abc` as `--ticket=-abc`: a ticket may begin with "-", which argparse reads as an option."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] == "--ticket":
            out[-1] = f"--ticket={arg}"
        else:
            out.append(arg)
    return out


class UsageError(Exception):
    pass


def _token_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as file:
            if os.fstat(file.fileno()).st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                print(f"runledger: warning: {path} is open to other users: chmod 600 it", file=sys.stderr)
            token = file.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the token file {path}: {exc}") from None
    if not token:
        raise UsageError(f"the token file {path} is empty")
    return token


def token_from(args: argparse.Namespace) -> str | None:
    """The token: --token, --token-file, $RUNLEDGER_TOKEN, $RUNLEDGER_TOKEN_FILE, in that order;
    else asked for on the terminal (not echoed); else None."""
    if getattr(args, "token", None):
        return str(args.token)
    if getattr(args, "token_file", None):
        return _token_file(args.token_file)
    if os.environ.get("RUNLEDGER_TOKEN"):
        return os.environ["RUNLEDGER_TOKEN"]
    if os.environ.get("RUNLEDGER_TOKEN_FILE"):
        return _token_file(os.environ["RUNLEDGER_TOKEN_FILE"])
    if sys.stdin.isatty():
        return getpass.getpass("Runledger API token: ").strip() or None
    return None


def is_local(host: str) -> bool:
    """A host only this machine reaches: localhost, or a loopback address (IPv4-mapped included)."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def plain_http_warning(url: str) -> str | None:
    """What to say before sending a token over plain HTTP to another machine; None when it is fine."""
    where = urlsplit(url)
    if where.scheme != "http" or is_local(where.hostname or ""):
        return None
    return f"runledger: warning: {url} is plain HTTP: the token and the runs cross the network unencrypted"


def main(argv: Sequence[str] | None = None) -> int:
    top = parser()
    args = top.parse_args(_attached(sys.argv[1:] if argv is None else list(argv)))  # a usage error exits 2 here
    url = getattr(args, "url", None) or os.environ.get("RUNLEDGER_URL")
    try:
        token = token_from(args) if url else None
    except UsageError as exc:
        print(f"runledger: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except (EOFError, KeyboardInterrupt):
        print(file=sys.stderr)
        token = None
    if not url or not token:
        top.print_usage(sys.stderr)
        print(
            "runledger: error: give --url and --token or --token-file, or set RUNLEDGER_URL and RUNLEDGER_TOKEN or "
            "RUNLEDGER_TOKEN_FILE",
            file=sys.stderr,
        )
        return USAGE_ERROR
    warning = plain_http_warning(url)
    if warning is not None:
        print(warning, file=sys.stderr)
    try:
        with Client(url, token) as client:
            status: int = args.handler(client, args)
            return status
    except UsageError as exc:
        print(f"runledger: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except Conflict as exc:
        if exc.run is not None:
            print(exc.run.status)  # the committed state: what the run is, whatever was asked
        print(f"runledger: refused: {printable(str(exc))}", file=sys.stderr)
        return REFUSED
    except APIError as exc:
        print(f"runledger: refused: {printable(str(exc))}", file=sys.stderr)
        return REFUSED
    except TransportError as exc:
        print(f"runledger: cannot reach {url}: {exc}", file=sys.stderr)
        return REFUSED
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`runledger watch ID | head`); say nothing more on a closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return REFUSED


if __name__ == "__main__":
    sys.exit(main())
