"""The locked write core every service is made of (docs/design/commands.md#one-transaction): lock the
run, require its transition, append its events, end it, park it, requeue it. Each helper runs in
the caller's transaction, under the run's row lock the caller took (`lock_run`, or `lock_current`
for a worker's attempt); `pg_notify` in the transaction is delivered only at commit, so no process
hears of a write that rolled back."""

import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import F

from runs import notify, signals
from runs.agents import partial_output_types
from runs.conf import conf
from runs.events import (
    PARTIAL_OUTPUT,
    TERMINAL_EVENT,
    USAGE_INCOMPLETE,
    USAGE_MAX,
    USAGE_SATURATED,
    EventType,
    RequeueCause,
    ToolStatus,
    WaitReason,
)
from runs.exceptions import BudgetExhausted, InvalidTransition
from runs.metrics import series
from runs.models import AttemptOutcome, Run, RunAttempt, RunEvent
from runs.selectors.wire import carried_events_sql
from runs.services import webhooks

# The locks live in runs.services.locks; the services built on this core take them from here.
from runs.services.locks import Around, around
from runs.services.locks import lock_current as lock_current
from runs.services.locks import lock_or_skip as lock_or_skip
from runs.services.locks import lock_run as lock_run
from runs.services.statements import (
    Statement,
    columns,
    from_row,
    insert,
    send_last,
    send_prepared,
    send_together,
    update,
)
from runs.storable import json_bytes
from runs.transitions import TERMINAL, FailCode, Status, StopCode, check_transition, descendant_end

# `ended_by` and `by` of what the platform itself does (docs/design/events.md#types).
SYSTEM = "system"

# The fields of the run that `append` changes, which its caller saves (and `reported_usage`, when it
# appends `usage.reported`: only the agent's appends do).
APPENDED = ["last_seq", "stored_bytes", "partial_events"]


def require_transition(run: Run, target: Status) -> None:
    """`transitions.check_transition` for a locked run: the refusal carries the run's state."""
    try:
        check_transition(run.status, target)
    except InvalidTransition as exc:
        exc.run = run
        raise


def append(
    run: Run,
    events: Sequence[tuple[str, dict[str, Any]]],
    *,
    attempt: int | None,
    now: datetime,
    notes: Sequence[notify.Note] = (),
) -> list[RunEvent]:
    """Append under the lock the caller holds; seq is the run's counter, so it is gap-free. The
    caller saves `last_seq` and `stored_bytes` (and `open_tool_calls`, if it appends tool events)
    with the rest of its changes to the run (`APPENDED`). `notes` go out with the events' own
    notification."""
    rows = event_rows(run, events, attempt=attempt, now=now)
    RunEvent.objects.bulk_create(rows)
    notify.send(events_note(run, rows), *notes)
    series.events_appended(len(rows))
    return rows


def events_note(run: Run, rows: Sequence[RunEvent]) -> notify.Note:
    """The notification of `rows`, the run's events this transaction inserts, sent after them: it
    carries them when they fit (runs.selectors.wire `carried_events_sql`), so a stream that hears
    it sends them without a read (docs/design/streaming.md#hub)."""
    return notify.events_committed(run.id, run.last_seq, carried_events_sql(run.id, rows))


def event_rows(
    run: Run, events: Sequence[tuple[str, dict[str, Any]]], *, attempt: int | None, now: datetime
) -> list[RunEvent]:
    """The rows of `events`, numbered on from the run's `last_seq`, counted on the run (`APPENDED`)
    as `append` counts them; the caller inserts them."""
    rows = []
    # What the run's end says of its partial output, and its usage, are counted here, on the row
    # the caller saves anyway: never a statement of their own, never a read of the events.
    partial_types = partial_output_types(run.agent)
    for type_, data in events:
        if type_ == EventType.TOOL_STARTED:
            run.open_tool_calls = [*run.open_tool_calls, [data["call_id"], data.get("name")]]
        elif type_ == EventType.TOOL_FINISHED:
            run.open_tool_calls = [call for call in run.open_tool_calls if call[0] != data["call_id"]]
        elif type_ == EventType.USAGE_REPORTED:
            add_usage(run, data)
        if type_ in partial_types:
            run.partial_events += 1
        run.last_seq += 1
        size = json_bytes(data)
        # Counted on the run row this transaction writes anyway: an owner's total is a sum over
        # their runs at create, never a row of its own that every append of theirs would queue on.
        run.stored_bytes += size
        rows.append(
            RunEvent(run=run, seq=run.last_seq, type=type_, data=data, attempt=attempt, created_at=now, data_bytes=size)
        )
    return rows


def write_appended(
    run: Run,
    rows: Sequence[RunEvent],
    *,
    fields: Sequence[str],
    notes: Sequence[notify.Note],
    event_type: str | None = None,
    closing: Statement | None = None,
    ended: bool = False,
) -> None:
    """Insert `rows`, close the attempt (`closing`, from `close_statement`), save the run's
    `fields` and send the events' notification with `notes`: one round trip. With `event_type`, a
    webhook notification of it too (`webhooks.outbox`): when an endpoint may want it (`around`),
    the endpoints are read in the first of two round trips, with the events and the attempt
    written, so that its body is the run as this write leaves it. `ended`: the run's bytes are
    final once its notification's are counted."""
    sent = [insert(rows), *([closing] if closing is not None else [])]
    notes = [events_note(run, rows), *notes]
    if event_type is not None and around(run).endpoints:
        found = send_prepared(*sent, webhooks.endpoints_read(run))
        if closing is not None:
            _closed(run, found[1])
        sent, size = webhooks.outbox(run, event_type, endpoints=found[-1], now=rows[-1].created_at)
        if sent:
            notes.append(notify.webhooks_due())
        # Its body is stored for the owner like an event: counted on the run.
        run.stored_bytes += size
        closing = None
    if ended:
        run.ended_bytes = run.stored_bytes
    signal = notify.statement(*notes)
    # The last writes of a command that holds them go with its COMMIT (`holding`).
    then = (lambda found: _closed(run, found[1])) if closing is not None else None
    send_last(*sent, update(run, fields), *([signal] if signal is not None else []), then=then)
    series.events_appended(len(rows))


def add_usage(run: Run, report: dict[str, Any]) -> None:
    """Sum a usage report (the data of a checked `usage.reported`) into the run's
    `reported_usage`, and count it by agent for /metrics/ once committed. A sum that would pass
    USAGE_MAX (two reports of 1.5e308: infinity, which no JSON column stores) stays at USAGE_MAX and
    is listed under USAGE_SATURATED: the run goes on (docs/design/events.md#usage)."""
    summed = dict(run.reported_usage)
    saturated = set(summed.get(USAGE_SATURATED, ()))
    for key, value in report.items():
        if key == USAGE_INCOMPLETE:
            summed[key] = bool(summed.get(key)) or bool(value)
            continue
        total = _usage_sum(summed.get(key, 0), value)
        if total is None:
            saturated.add(key)
        summed[key] = USAGE_MAX if total is None else total
    if saturated:
        summed[USAGE_SATURATED] = sorted(saturated)
    run.reported_usage = summed
    series.usage_reported(run.agent, report)


def _usage_sum(stored: float, reported: float) -> float | None:
    """The sum, or None past USAGE_MAX. PostgreSQL gives a stored float back as an integer of its
    digits (1.5e308: 309 of them), so the two may be an integer and a float."""
    try:
        total = stored + reported
    except OverflowError:  # an integer past any float, added to a float
        return None
    return total if total <= USAGE_MAX else None


def close_attempt(run: Run, outcome: AttemptOutcome, *, now: datetime, released: bool) -> None:
    send_together(close_statement(run, outcome, now=now, released=released))


def close_statement(run: Run, outcome: AttemptOutcome, *, now: datetime, released: bool) -> Statement:
    """The UPDATE that closes the run's open current attempt with `outcome`, returning it: the
    command's answer shows it without reading it again (`_closed`)."""
    table = RunAttempt._meta.db_table
    sets = "outcome = %s"
    params: list[Any] = [outcome.value]
    if released:
        sets += ", released_at = %s"
        params.append(connection.ops.adapt_datetimefield_value(now))
    run_key = RunAttempt._meta.get_field("run").get_db_prep_save(run.pk, connection)
    where = "run_id = %s AND generation = %s AND outcome = %s"
    sql = f"UPDATE {table} SET {sets} WHERE {where} RETURNING {columns(RunAttempt)}"
    return sql, [*params, run_key, run.generation, AttemptOutcome.RUNNING.value]


def _closed(run: Run, rows: Sequence[tuple[Any, ...]]) -> None:
    # The run's JSON takes its current attempt from here (as a list's prefetch) instead of a read.
    if rows:
        run.current_attempts = [from_row(RunAttempt, rows[0])]  # type: ignore[attr-defined]


def has_room(run: Run, events: int) -> bool:
    """Whether `events` more events fit in the run's `max_events`. Every event counts but the
    platform's record of the run's life: `run.created`, `run.started`, `run.requeued`, and a
    worker's completed or failed end."""
    return run.max_events is None or run.events_used + events <= run.max_events


def no_room(run: Run, events: int, what: str) -> BudgetExhausted:
    """The refusal of a command whose `events` would pass the run's `max_events` (the 409's run
    shows `events_used` and `max_events`)."""
    return BudgetExhausted(
        f"{what} writes {events} event(s); {run.events_used} of the max_events budget of {run.max_events} are used",
        run=run,
    )


def _seals(run: Run) -> list[tuple[str, dict[str, Any]]]:
    """A `tool.finished` `interrupted` for each open tool call: what ends a call its attempt will
    never finish, at a run's end or at a park."""
    return [
        (EventType.TOOL_FINISHED, {"call_id": call_id, "name": name, "status": ToolStatus.INTERRUPTED})
        for call_id, name in run.open_tool_calls
    ]


def park(run: Run, reason: WaitReason, *, prompt: str | None, attempt: int | None, now: datetime) -> None:
    """Make the run `waiting` with a new resume ticket and its `run.waiting` event.

    An open tool call is sealed first: the attempt that started it is gone, so the run resumes
    from a finished call, never from the middle of one. The events count against `max_events`;
    when they would pass it, `BudgetExhausted` is raised and nothing is written."""
    require_transition(run, Status.WAITING)
    events = [*_seals(run), (EventType.RUN_WAITING, {"reason": reason, "prompt": prompt})]
    if not has_room(run, len(events)):
        raise no_room(run, len(events), "a pause" if reason == WaitReason.PAUSED else "a wait for input")
    run.status = Status.WAITING
    run.resume_ticket = secrets.token_hex(24)  # hex: never begins with "-", which a command line reads as an option
    run.pause_requested_at = None
    run.updated_at = now
    run.events_used += len(events)
    rows = event_rows(run, events, attempt=attempt, now=now)
    fields = [
        "status",
        "resume_ticket",
        "pause_requested_at",
        "updated_at",
        *APPENDED,
        "events_used",
        "open_tool_calls",
    ]
    # The control note: a worker that held the run lets go of it (or re-reads, finds nothing to do).
    notes = [notify.control_changed(run.id, run.status)]
    write_appended(run, rows, fields=fields, notes=notes, event_type=EventType.RUN_WAITING)


def end(
    run: Run,
    status: Status,
    *,
    code: str,
    reason: str,
    by: str,
    now: datetime,
    attempt: int | None = None,
    output: Any = None,
    error: Any = None,
    cascade: bool = True,
) -> None:
    """Make the run terminal with its one terminal event, then end its unfinished descendants."""
    require_transition(run, status)
    was_running = run.status == Status.RUNNING
    ended: dict[str, Any] = {
        "status": status,
        "end_code": code,
        "end_reason": reason,
        "ended_by": by,
        "output": output,
        "error": error,
        "ended_at": now,
        "updated_at": now,
        # A ticket, or a pause request, has nothing left to act on.
        "resume_ticket": "",
        "pause_requested_at": None,
    }
    for field, value in ended.items():
        setattr(run, field, value)
    # Measured once here, so a list can leave a big one out without reading it.
    run.output_bytes = 0 if output is None else json_bytes(output)
    run.error_bytes = 0 if error is None else json_bytes(error)
    run.stored_bytes += run.output_bytes + run.error_bytes
    # From the locked row (its `partial_events`): the text itself is read with the run's JSON.
    partial = run.partial_events > 0
    if status == Status.COMPLETED:
        data: dict[str, Any] = {"output": output}
    elif status == Status.FAILED:
        data = {"code": code, "reason": reason, "error": error, PARTIAL_OUTPUT: partial}
    elif status == Status.CANCELLED:
        data = {"code": code, "note": reason, "by": by, PARTIAL_OUTPUT: partial}
    else:
        data = {"code": code, "reason": reason, "by": by, PARTIAL_OUTPUT: partial}
    # One finish boundary: every open tool call ends, just before the terminal event.
    events = [*_seals(run), (TERMINAL_EVENT[status], data)]
    if status in (Status.CANCELLED, Status.STOPPED):
        # A cancel or a stop counts like any other event, but is never refused for the budget: an
        # end must always be possible, so these may pass `max_events`.
        run.events_used += len(events)
    notes = [notify.control_changed(run.id, status)]
    if was_running and conf.MAX_RUNNING_PER_USER:
        # The owner's next run may be claimable now, by any worker: wake them all, not only the one
        # whose slot this frees (the others would wait for their poll).
        notes.append(notify.slot_freed(run.id))
    if run.schedule_id is not None:
        # A `buffer_one` due time may wait for this end: the schedulers look now, not at their poll.
        notes.append(notify.schedules_changed())
    rows = event_rows(run, events, attempt=attempt, now=now)
    # The worker learns of it through the control notification (or its re-read) and records
    # released_at itself once it has actually stopped. Closed before the webhook notification's
    # body is made: it carries the run as it ended.
    closing = (
        close_statement(run, AttemptOutcome(status), now=now, released=attempt is not None) if was_running else None
    )
    sizes = ["output_bytes", "error_bytes", "ended_bytes"]
    write_appended(
        run,
        rows,
        fields=[*ended, *APPENDED, *sizes, "open_tool_calls", "events_used"],
        notes=notes,
        event_type=TERMINAL_EVENT[status],
        closing=closing,
        ended=True,
    )
    # At commit, like the notifications: host code hears of an end only once it holds.
    signals.send_run_ended(run)
    if cascade and around(run).children:
        _end_descendants(run, now=now)


def _end_descendants(run: Run, *, now: datetime) -> None:
    """End every unfinished descendant with the code this run's outcome gives
    (docs/design/commands.md#children)."""
    # Locks go ancestor → descendant everywhere (child creation locks the parent first), so this
    # cannot deadlock with another command. A terminal child needs no visit: when it ended, its
    # own descendants ended with it.
    status, code = descendant_end(run.status)
    reason = f"parent run {run.id} {run.status}"
    frontier = [run.pk]
    while frontier:
        children = list(
            Run.objects.select_for_update(no_key=True)
            .filter(parent_id__in=frontier)
            .exclude(status__in=TERMINAL)
            .order_by("created_at", "id")
        )
        for child in children:
            if child.owner_id == run.owner_id:
                # The same owner's endpoints, which the run's lock looked for.
                child._around = Around(endpoints=around(run).endpoints)  # type: ignore[attr-defined]
            end(child, status, code=code, reason=reason, by=SYSTEM, now=now, cascade=False)
        frontier = [child.pk for child in children]


def requeue(run: Run, *, cause: RequeueCause, now: datetime) -> None:
    """Requeue the locked running run, whose current attempt ended without finishing (or park it,
    if a pause is pending); `queued_at` says when it entered the queue."""
    generation = run.generation
    if cause == RequeueCause.LEASE_EXPIRED:
        # Lost, whether its worker died or gave it up (abandoned) once it could not renew the lease.
        lost = RunAttempt.objects.filter(run=run, generation=generation)
        held = lost.filter(outcome__in=[AttemptOutcome.RUNNING, AttemptOutcome.ABANDONED])
        series.attempts_lost(held.update(outcome=AttemptOutcome.LOST))
        # Self-fencing stopped the work by the time its lease lapsed, unless the worker said earlier.
        lost.filter(released_at__isnull=True).update(released_at=F("lease_expires_at"))
        run.lost_attempts += 1
        run.save(update_fields=["lost_attempts"])
        if run.lost_attempts >= run.max_attempts:
            reason = f"{run.lost_attempts} of {run.max_attempts} attempts lost their worker"
            end(run, Status.FAILED, code=FailCode.WORKER_LOST, reason=reason, by=SYSTEM, now=now)
            return
    else:
        close_attempt(run, AttemptOutcome.SHUTDOWN, now=now, released=True)
    require_transition(run, Status.QUEUED)
    pausing = run.pause_requested_at is not None
    run.status = Status.QUEUED
    run.updated_at = now
    # Stamped even when a pending pause parks it below: it did enter the queue (its `run.requeued`
    # says so), and the cancel latencies tell an attempt lost to its lease by it (selectors.overview).
    run.queued_at = now
    requeued = {"generation": generation, "cause": cause}
    # Woken only if it stays queued: a pending pause parks it below.
    notes = [] if pausing else [notify.run_queued(run.id)]
    append(run, [(EventType.RUN_REQUEUED, requeued)], attempt=None, now=now, notes=notes)
    run.save(update_fields=["status", "updated_at", *APPENDED, "queued_at"])
    if pausing:
        # The pause its caller was answered 202 for still happens: the attempt ended at a boundary
        # of its own, so the run parks there, after the event that says the attempt ended.
        try:
            park(run, WaitReason.PAUSED, prompt=None, attempt=None, now=now)
        except BudgetExhausted:
            # No room for the pause it was promised: the run stops, as at any write past its budget.
            stop_over_budget(run, "max_events", now=now)


def stop_over_budget(run: Run, budget: str, *, now: datetime) -> None:
    """Stop the locked run because a write would pass its `budget` (`max_events` or `max_steps`)."""
    allowed = run.max_events if budget == "max_events" else run.max_steps
    reason = f"{budget} budget of {allowed} exhausted"
    # Written by the platform (attempt null), like the sweeper's stops; a worker that held the run
    # records its own release once it has stopped.
    end(run, Status.STOPPED, code=StopCode.BUDGET_EXHAUSTED, reason=reason, by=SYSTEM, now=now)
