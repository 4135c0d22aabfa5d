"""`runledger schedules …`: the caller's schedules (docs/design/schedules.md). Each command takes
the client, its arguments and the output, and returns the exit status, as those of
runledger_client.cli do."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from runledger_client._cli_args import OK, at_most, deleting, given_args
from runledger_client._output import Output, dumps, facts, printable
from runledger_client.client import Client
from runledger_client.models import Run, Schedule


def _timing(schedule: Schedule) -> str:
    if schedule.cron:
        return f"cron {schedule.cron} ({schedule.timezone})"
    return f"every {schedule.every_seconds} s"


def _facts(schedule: Schedule) -> str:
    """A schedule for people: its facts, one per line."""
    last = schedule.last_run
    shown = [
        ("id", schedule.id),
        ("agent", schedule.agent),
        ("input", dumps(schedule.input)),
        ("timing", _timing(schedule)),
        ("overlap", schedule.overlap),
        ("catchup", f"{schedule.catchup_window_seconds} s" if schedule.catchup_window_seconds else ""),
        ("start_at", schedule.data.get("start_at")),
        ("end_at", schedule.data.get("end_at")),
        ("metadata", ", ".join(f"{k}={v}" for k, v in schedule.metadata.items())),
        ("priority", schedule.priority or ""),
        ("state", "paused" if schedule.paused else "active"),
        ("next_due_at", schedule.data.get("next_due_at") or "none"),
        ("last_run", f"{last.id} {last.status}" if last else ""),
        ("created_at", schedule.data.get("created_at")),
    ]
    return facts(shown)


def _line(schedule: Schedule) -> str:
    state = "paused" if schedule.paused else "active"
    due = schedule.data.get("next_due_at") or "-"
    last = f"last {schedule.last_run.status}" if schedule.last_run else ""
    return f"{schedule.id}  {state}  {printable(schedule.agent):<16}  {printable(_timing(schedule)):<32}  {due}  {last}"


def cmd_create(client: Client, args: argparse.Namespace, out: Output) -> int:
    as_parsed = ("cron", "timezone", "overlap", "start_at", "end_at", "priority")
    options = given_args(
        args,
        *as_parsed,
        every_seconds=args.every,
        catchup_window_seconds=args.catchup,
        metadata=dict(args.meta) if args.meta else None,
    )
    schedule = client.schedules.create(args.agent, args.input, **options)
    out.one(schedule.data, f"{schedule.id}\nnext due: {schedule.data.get('next_due_at') or 'none'}")
    return OK


def cmd_list(client: Client, args: argparse.Namespace, out: Output) -> int:
    out.many((schedule.data, _line(schedule)) for schedule in at_most(client.schedules.list(), args.limit))
    return OK


def _one(action: str) -> Callable[[Client, argparse.Namespace, Output], int]:
    """`show` (the client's `get`), `pause` or `resume`: the schedule after it, its facts."""

    def command(client: Client, args: argparse.Namespace, out: Output) -> int:
        schedule: Schedule = getattr(client.schedules, action)(args.id)
        out.one(schedule.data, _facts(schedule))
        return OK

    return command


def cmd_trigger(client: Client, args: argparse.Namespace, out: Output) -> int:
    run = client.schedules.trigger(args.id)
    out.one(run.data, run.id)
    return OK


def cmd_backfill(client: Client, args: argparse.Namespace, out: Output) -> int:
    runs = client.schedules.backfill(args.id, start=args.start, end=args.end, max=args.max)
    out.many((run.data, _run_line(run)) for run in runs)
    return OK


def _run_line(run: Run) -> str:
    return f"{run.id}  due {run.data['schedule']['due_at'] if run.schedule else '-'}"


HANDLERS: dict[str, Callable[[Client, argparse.Namespace, Output], int]] = {
    "schedules create": cmd_create,
    "schedules list": cmd_list,
    "schedules show": _one("get"),
    "schedules pause": _one("pause"),
    "schedules resume": _one("resume"),
    "schedules trigger": cmd_trigger,
    "schedules backfill": cmd_backfill,
    "schedules delete": deleting("id", lambda client, id: client.schedules.delete(id)),
}
