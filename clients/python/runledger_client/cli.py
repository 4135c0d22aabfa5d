"""`runledger`: the Runledger API from a shell.

Exit status: 0 on success (a cancel of a run already cancelled included; `watch` once the stream
ends at the run's terminal event), 1 when the server refuses or cannot be reached, 2 on a usage
error. Commands print the run's status on stdout — on a refused command the committed status (a
cancel that lost the race to completion prints `completed`) — and explain on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from runledger_client.client import Client
from runledger_client.errors import APIError, Conflict, TransportError
from runledger_client.models import Event, Run

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


def _seq(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError("must be an integer >= 0")
    return int(text)


# --- the commands: each takes the client and its arguments, and returns the exit status ---------


def cmd_create(client: Client, args: argparse.Namespace) -> int:
    options = {
        "parent": args.parent,
        "max_steps": args.max_steps,
        "max_events": args.max_events,
        "max_attempts": args.max_attempts,
        "deadline": args.deadline,
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
    filters = {"status": args.status, "agent": args.agent, "parent": args.parent}
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
            out.write(event.text + "\n")
        elif event.type == "output.delta":
            text = str(event.data.get("text", ""))
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
    return _status(client.cancel(args.id, note=args.note))


def cmd_stop(client: Client, args: argparse.Namespace) -> int:
    return _status(client.stop(args.id, reason=args.reason, code=args.code))


def cmd_pause(client: Client, args: argparse.Namespace) -> int:
    run = client.pause(args.id)
    if run.status == "running":
        print("pause requested: the worker parks the run at its next safe boundary", file=sys.stderr)
    return _status(run)


def cmd_resume(client: Client, args: argparse.Namespace) -> int:
    return _status(client.resume(args.id, ticket=args.ticket, input=args.input))


def _status(run: Run) -> int:
    print(run.status)
    return 0


class StatusLine:
    """`watch`'s live status on a terminal: one line on stderr, rewritten in place."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.last = ""

    def show(self, event: Event) -> None:
        self.last = f"seq {event.seq}  {event.type}"
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
    connection.add_argument("--token", default=argparse.SUPPRESS, help="an API token (or $RUNLEDGER_TOKEN)")
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
    create.add_argument("--parent")
    create.add_argument("--max-steps", type=int)
    create.add_argument("--max-events", type=int)
    create.add_argument("--max-attempts", type=int)
    create.add_argument("--deadline", help="absolute ISO 8601 time")
    create.add_argument("--idempotency-key", help="default: a new one (retries of this command reuse it)")

    listing = command("list", cmd_list, "list the runs you can see, newest first")
    listing.add_argument("--status")
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

    cancel = command("cancel", cmd_cancel, "cancel a run (a run already cancelled is a success)")
    cancel.add_argument("id")
    cancel.add_argument("--note", default="")

    stop = command("stop", cmd_stop, "stop a run (needs the runs.stop_run permission)")
    stop.add_argument("id")
    stop.add_argument("--reason", required=True)
    stop.add_argument("--code", choices=["staff", "policy", "budget_exhausted", "deadline_exceeded"])

    pause = command("pause", cmd_pause, "pause a run")
    pause.add_argument("id")

    resume = command("resume", cmd_resume, "resume a waiting run with its ticket")
    resume.add_argument("id")
    resume.add_argument("--ticket", required=True)
    resume.add_argument("--input", type=_json_value, metavar="JSON")
    return top


def _attached(argv: list[str]) -> list[str]:
    """`--ticket -abc` as `--ticket=-abc`: a ticket may begin with "-", which argparse reads as an option."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] == "--ticket":
            out[-1] = f"--ticket={arg}"
        else:
            out.append(arg)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    top = parser()
    args = top.parse_args(_attached(sys.argv[1:] if argv is None else list(argv)))  # a usage error exits 2 here
    url = getattr(args, "url", None) or os.environ.get("RUNLEDGER_URL")
    token = getattr(args, "token", None) or os.environ.get("RUNLEDGER_TOKEN")
    if not url or not token:
        top.print_usage(sys.stderr)
        print("runledger: error: give --url and --token, or set RUNLEDGER_URL and RUNLEDGER_TOKEN", file=sys.stderr)
        return USAGE_ERROR
    try:
        with Client(url, token) as client:
            status: int = args.handler(client, args)
            return status
    except Conflict as exc:
        if exc.run is not None:
            print(exc.run.status)  # the committed state: what the run is, whatever was asked
        print(f"runledger: refused: {exc}", file=sys.stderr)
        return REFUSED
    except APIError as exc:
        print(f"runledger: refused: {exc}", file=sys.stderr)
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
