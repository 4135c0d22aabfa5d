"""`runledger`: the Runledger API from a shell.

Exit status (`EXIT_STATUSES`): 0 on success (a cancel of a run already cancelled included; `watch`
and `wait` once the run ended), 1 when the server refuses, 2 on a usage error, 3 when the server
cannot be reached; with `--exit-status`, `watch` and `wait` exit 0 completed, 4 failed,
5 cancelled, 6 stopped. A refused command prints the committed status — a cancel that lost the
race to completion prints `completed` — and explains on stderr.

Output (`-o text|json|jsonl`, runledger_client._output): text for people, the API's JSON for
scripts. What agents write reaches the terminal without control sequences (`printable`).
"""

from __future__ import annotations

import argparse
import getpass
import ipaddress
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any, TextIO
from urllib.parse import urlsplit

from runledger_client import _cli_args, _cli_schedules, _cli_tokens, _cli_webhooks
from runledger_client._cli_args import EXIT_BY_STATUS, OK, REFUSED, UNREACHABLE, USAGE_ERROR, at_most, given_args
from runledger_client._completion import SCRIPTS
from runledger_client._config import resolve
from runledger_client._core import Retry
from runledger_client._output import Output, dumps, facts, printable, printable_json
from runledger_client.client import Client
from runledger_client.errors import APIError, ConfigError, Conflict, TransportError
from runledger_client.models import BulkResult, Event, Run

__all__ = ["main", "parser", "printable", "printable_json"]


class UsageError(Exception):
    pass


# A person or a script is waiting: an unreachable server is said within about 2 s of retries (4
# tries, 0.2 s doubling), not the library's 4.5 s; a stream, once accepted, still reconnects as long.
CLI_RETRY = Retry(attempts=4, cap=2.0)


# --- the commands: each takes the client, its arguments and the output, and returns the exit status


# The budgets and deadline a create or a rerun may be given.
BUDGETS = ("max_steps", "max_events", "max_attempts", "deadline")
# What `cancel`/`stop` may match runs by (and `list` filters them by), besides --where.
MATCH = ("status", "agent", "end_code", "schedule")


def cmd_create(client: Client, args: argparse.Namespace, out: Output) -> int:
    metadata = dict(args.meta) if args.meta else None
    options = given_args(args, "parent", *BUDGETS, "priority", "start_after", metadata=metadata)
    run = client.runs.create(args.agent, args.input, idempotency_key=args.idempotency_key, **options)
    out.one(run.data, run.id)
    return OK


def _run_line(run: Run) -> str:
    return f"{run.id}  {run.status:<9}  {printable(run.agent):<16}  {run['created_at']}"


def cmd_list(client: Client, args: argparse.Namespace, out: Output) -> int:
    filters = given_args(args, *MATCH, "parent", metadata=dict(args.where) if args.where else None)
    runs = at_most(client.runs.list(**filters), args.limit)
    out.many((run.data, _run_line(run)) for run in runs)
    return OK


def _run_text(run: Run) -> str:
    """A run for people: its facts, one per line; what an agent wrote made safe to show."""
    return facts(_facts(run))


def _facts(run: Run) -> list[tuple[str, Any]]:
    budgets = [
        f"{name} {used}/{'-' if most is None else most}"
        for name, used, most in (("steps", run.steps_used, run.max_steps), ("events", run.events_used, run.max_events))
    ]
    return [
        ("id", run.id),
        ("agent", run.agent),
        ("status", run.status),
        ("end_code", run.end_code),
        ("end_reason", run.end_reason),
        ("owner", run.owner),
        ("created_at", run["created_at"] if "created_at" in run.data else None),
        ("ended_at", run.data.get("ended_at")),
        ("parent", run.parent),
        ("rerun_of", run.rerun_of),
        ("metadata", ", ".join(f"{k}={v}" for k, v in run.metadata.items())),
        ("budgets", ", ".join(budgets)),
        ("last_seq", run.last_seq),
        ("ticket", run.resume_ticket),
        ("output", None if run.output is None else dumps(run.output)),
        ("error", None if run.error is None else dumps(run.error)),
    ]


def cmd_show(client: Client, args: argparse.Namespace, out: Output) -> int:
    run = client.runs.get(args.id)
    out.one(run.data, _run_text(run))
    return OK


def _outcome(run: Run | None, args: argparse.Namespace) -> int:
    if not args.exit_status or run is None:
        return OK
    return EXIT_BY_STATUS.get(run.status, REFUSED)


def cmd_watch(client: Client, args: argparse.Namespace, out: Output) -> int:
    # Read first: a missing run or an unreachable server answers at once, not after the stream's
    # longer reconnect budget.
    run = client.runs.get(args.id)
    status = StatusLine(sys.stderr) if sys.stderr.isatty() else None
    if out.format == "json":
        with client.runs.stream(args.id, after_seq=args.after_seq) as stream:
            out.line(dumps([event.object for event in stream], indent=2))
    else:
        _watch_lines(client, args, out.out, status, text=out.text)
    if status is not None:
        status.done()
    return _outcome(client.runs.get(args.id) if args.exit_status else run, args)


def _watch_lines(client: Client, args: argparse.Namespace, out: TextIO, status: StatusLine | None, text: bool) -> None:
    text_ends_line = True
    with client.runs.stream(args.id, after_seq=args.after_seq) as stream:
        for event in stream:
            if not text:
                out.write(printable_json(event.text) + "\n")
            elif event.type == "output.delta":
                delta = printable(str(event.data.get("text", "")))
                out.write(delta)
                text_ends_line = delta.endswith("\n") if delta else text_ends_line
            out.flush()
            if status is not None:
                status.show(event)
    if text and not text_ends_line:
        out.write("\n")
        out.flush()


def cmd_events(client: Client, args: argparse.Namespace, out: Output) -> int:
    def rows() -> Iterator[tuple[Any, str]]:
        after, shown = args.after_seq, 0
        while True:
            page = client.runs.events(args.id, after_seq=after)
            for event in page.events:
                if args.limit and shown >= args.limit:
                    return
                shown += 1
                yield event.object, f"{event.seq:>6}  {printable(event.type):<20}  {event.object.get('created_at')}"
            if page.end_of_stream or not page.events:
                return
            after = page.next_after_seq

    out.many(rows())
    return OK


def cmd_wait(client: Client, args: argparse.Namespace, out: Output) -> int:
    run = client.runs.wait(args.id, released=args.released)
    out.one(run.data, run.status)
    return _outcome(run, args)


def cmd_agents(client: Client, args: argparse.Namespace, out: Output) -> int:
    out.many(
        (agent.data, f"{printable(agent.name):<16}  {' '.join(agent.event_types)}") for agent in client.agents.list()
    )
    return OK


def cmd_cancel(client: Client, args: argparse.Namespace, out: Output) -> int:
    filters = _match(args)
    if filters is None:
        return _run_status(client.runs.cancel(args.id, note=args.note), out)
    limit = _confirmed(client, filters, args, "cancel")
    if limit is None:
        return REFUSED
    return _outcomes(client.runs.cancel_where(max=limit, note=args.note, **filters), out)


def cmd_stop(client: Client, args: argparse.Namespace, out: Output) -> int:
    filters = _match(args)
    if filters is None:
        return _run_status(client.runs.stop(args.id, reason=args.reason, code=args.code), out)
    limit = _confirmed(client, filters, args, "stop")
    if limit is None:
        return REFUSED
    return _outcomes(client.runs.stop_where(max=limit, reason=args.reason, code=args.code, **filters), out)


def _match(args: argparse.Namespace) -> dict[str, Any] | None:
    """The filter of `cancel`/`stop --where …` (None: the command is on the one run `id`)."""
    chosen = given_args(args, *MATCH, metadata=dict(args.where) if args.where else None)
    if args.id is not None and (chosen or args.max is not None or args.yes):
        raise UsageError("give a run id, or a filter (--where, --status, --agent, --end-code, --schedule), not both")
    if args.id is None and not chosen:
        raise UsageError("give a run id, or a filter: --where KEY=VALUE, --status, --agent, --end-code or --schedule")
    return chosen if args.id is None else None


def _confirmed(client: Client, filters: dict[str, Any], args: argparse.Namespace, verb: str) -> int | None:
    """The `max` to send: --max, or the count the user confirms. None: not confirmed."""
    if args.yes and args.max is not None:
        return int(args.max)
    count = client.runs.count_where(**filters)
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


def _outcomes(result: BulkResult, out: Output) -> int:
    """`<outcome> <count>` lines (-o json: the API's answer, with the ids)."""
    out.one(result.as_json(), "\n".join(f"{outcome} {count}" for outcome, count in result.counts.items()))
    return OK


def cmd_pause(client: Client, args: argparse.Namespace, out: Output) -> int:
    run = client.runs.pause(args.id)
    if run.status == "running":
        print("pause requested: the worker parks the run at its next safe boundary", file=sys.stderr)
    return _run_status(run, out)


def cmd_resume(client: Client, args: argparse.Namespace, out: Output) -> int:
    return _run_status(client.runs.resume(args.id, ticket=args.ticket, input=args.input), out)


def cmd_rerun(client: Client, args: argparse.Namespace, out: Output) -> int:
    run = client.runs.rerun(args.id, from_seq=args.from_seq, **given_args(args, "input", *BUDGETS))
    out.one(run.data, run.id)
    return OK


def _run_status(run: Run, out: Output) -> int:
    out.one(run.data, run.status)
    return OK


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


HANDLERS = {
    "create": cmd_create,
    "list": cmd_list,
    "show": cmd_show,
    "watch": cmd_watch,
    "events": cmd_events,
    "wait": cmd_wait,
    "agents": cmd_agents,
    "cancel": cmd_cancel,
    "stop": cmd_stop,
    "pause": cmd_pause,
    "resume": cmd_resume,
    "rerun": cmd_rerun,
    **_cli_webhooks.HANDLERS,
    **_cli_tokens.HANDLERS,
    **_cli_schedules.HANDLERS,
}


def parser() -> argparse.ArgumentParser:
    return _cli_args.parser(HANDLERS)


# --- configuration --------------------------------------------------------------------------------


def _attached(argv: list[str]) -> list[str]:
    """`--ticket -abc` as `--ticket=-abc`: a ticket may begin with "-", which argparse reads as an option."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] == "--ticket":
            out[-1] = f"--ticket={arg}"
        else:
            out.append(arg)
    return out


def connection(args: argparse.Namespace) -> tuple[str, str]:
    """The server and token: the options, the environment, the profile (runledger_client._config);
    else the token is asked for on the terminal (not echoed). UsageError when either is missing."""
    found = resolve(
        url=getattr(args, "url", None),
        token=getattr(args, "token", None),
        token_file=getattr(args, "token_file", None),
        profile=getattr(args, "profile", None),
    )
    for warning in found.warnings:
        print(f"runledger: warning: {warning}", file=sys.stderr)
    token = found.token
    if found.url and not token and sys.stdin.isatty():
        try:
            token = getpass.getpass("Runledger API token: ").strip() or None
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
    if not found.url or not token:
        raise UsageError(
            "give --url and --token-file (or --token), set RUNLEDGER_URL and RUNLEDGER_TOKEN or RUNLEDGER_TOKEN_FILE, "
            "or write a profile (--profile)"
        )
    return found.url, token


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
    if args.command == "completion":
        sys.stdout.write(SCRIPTS[args.shell](top))
        return OK
    output = "jsonl" if getattr(args, "jsonl", False) else getattr(args, "output", "text")
    try:
        url, token = connection(args)
    except (UsageError, ConfigError) as exc:
        top.print_usage(sys.stderr)
        print(f"runledger: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    warning = plain_http_warning(url)
    if warning is not None:
        print(warning, file=sys.stderr)
    return _run(args, url, token, Output(output))


def _run(args: argparse.Namespace, url: str, token: str, out: Output) -> int:
    try:
        with Client(url, token, retry=CLI_RETRY) as client:
            status: int = args.handler(client, args, out)
            return status
    except UsageError as exc:
        print(f"runledger: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except Conflict as exc:
        if exc.run is not None:
            out.one(exc.run.data, exc.run.status)  # the committed state: what the run is, whatever was asked
        print(f"runledger: refused: {printable(str(exc))}", file=sys.stderr)
        return REFUSED
    except APIError as exc:
        print(f"runledger: refused: {printable(str(exc))}", file=sys.stderr)
        return REFUSED
    except TransportError as exc:
        print(f"runledger: cannot reach {url}: {printable(str(exc))}", file=sys.stderr)
        return UNREACHABLE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`runledger watch ID | head`); say nothing more on a closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return REFUSED


if __name__ == "__main__":
    sys.exit(main())
