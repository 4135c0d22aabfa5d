"""Every write to runs, events and attempts.

Each command is one transaction: lock the run row (`FOR NO KEY UPDATE`, so event and child inserts,
which take `FOR KEY SHARE` on it through their foreign key, are not blocked), check the transition
in `transitions`, write the run and its event(s) together, and notify — `pg_notify` inside the
transaction is delivered only at commit, so no other process hears of a write that rolled back.
On SQLite `select_for_update` is a no-op; IMMEDIATE transactions serialise the writers instead.
"""

import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AbstractUser
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q
from django.db.models.functions import Now
from django.utils import timezone

from runs import notify
from runs.agents import is_registered
from runs.exceptions import (
    IdempotencyMismatch,
    InvalidTransition,
    NotFound,
    StaleAttempt,
    StaleTicket,
    ValidationFailed,
)
from runs.models import AttemptOutcome, IdempotencyRecord, Run, RunAttempt, RunEvent
from runs.selectors import run_visible
from runs.transitions import (
    CALLER_STOP_CODES,
    TERMINAL,
    CancelCode,
    FailCode,
    Status,
    StopCode,
    check_transition,
    descendant_end,
)

SYSTEM = "system"

# Types only the platform writes; an agent may not append them.
LIFECYCLE_TYPES = frozenset(
    {
        "run.created",
        "run.started",
        "run.waiting",
        "run.resumed",
        "run.requeued",
        "run.completed",
        "run.failed",
        "run.cancelled",
        "run.stopped",
    }
)

_RUN_FIELDS_ON_END = [
    "status",
    "end_code",
    "end_reason",
    "ended_by",
    "output",
    "error",
    "ended_at",
    "resume_ticket",
    "pause_requested_at",
    "last_seq",
    "updated_at",
]

User = AbstractBaseUser


@dataclass(frozen=True)
class CommandResult:
    run: Run
    # False when the command found the run already in the state it asks for and wrote nothing.
    changed: bool
    # True when a running run's pause was recorded and the worker will act on it (HTTP 202).
    pending: bool = False


def _username(actor: User | None) -> str:
    return actor.get_username() if actor is not None else SYSTEM


def _lock(run_id: UUID | str) -> Run:
    try:
        return Run.objects.select_for_update(no_key=True).get(pk=run_id)
    except (Run.DoesNotExist, ValueError, DjangoValidationError) as exc:
        raise NotFound(f"run {run_id} not found") from exc


def _check(run: Run, target: Status) -> None:
    try:
        check_transition(run.status, target)
    except InvalidTransition as exc:
        exc.run = run
        raise


def _append(
    run: Run, events: Sequence[tuple[str, dict[str, Any]]], *, attempt: int | None, now: datetime
) -> list[RunEvent]:
    """Append under the lock the caller holds; seq is the run's counter, so it is gap-free."""
    rows = []
    for type_, data in events:
        run.last_seq += 1
        rows.append(RunEvent(run=run, seq=run.last_seq, type=type_, data=data, attempt=attempt, created_at=now))
    RunEvent.objects.bulk_create(rows)
    notify.events_committed(run.id, run.last_seq)
    return rows


def _db_now() -> datetime:
    """The database's clock. Leases are renewed by workers and judged by sweepers on other
    machines; reading both against this one clock means no machine's clock skew can expire a live
    lease or a deadline early."""
    if connection.vendor != "postgresql":
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        row = cursor.fetchone()
    assert row is not None
    now: datetime = row[0]
    return now


def _ticket() -> str:
    return secrets.token_urlsafe(24)


def _close_attempt(run: Run, outcome: AttemptOutcome, *, now: datetime, released: bool) -> None:
    changes: dict[str, Any] = {"outcome": outcome}
    if released:
        changes["released_at"] = now
    RunAttempt.objects.filter(run=run, generation=run.generation, outcome=AttemptOutcome.RUNNING).update(**changes)


def _end(
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
    _check(run, status)
    was_running = run.status == Status.RUNNING
    run.status = status
    run.end_code = code
    run.end_reason = reason
    run.ended_by = by
    run.output = output
    run.error = error
    run.ended_at = now
    run.updated_at = now
    run.resume_ticket = ""
    run.pause_requested_at = None
    if status == Status.COMPLETED:
        event: tuple[str, dict[str, Any]] = ("run.completed", {"output": output})
    elif status == Status.FAILED:
        event = ("run.failed", {"code": code, "reason": reason, "error": error})
    elif status == Status.CANCELLED:
        event = ("run.cancelled", {"code": code, "note": reason, "by": by})
    else:
        event = ("run.stopped", {"code": code, "reason": reason, "by": by})
    _append(run, [event], attempt=attempt, now=now)
    run.save(update_fields=_RUN_FIELDS_ON_END)
    if was_running:
        # The worker learns of it through the control notification (or its re-read) and records
        # released_at itself once it has actually stopped.
        _close_attempt(run, AttemptOutcome(status), now=now, released=attempt is not None)
    notify.control_changed(run.id)
    if cascade:
        _end_descendants(run, now=now)


def _end_descendants(run: Run, *, now: datetime) -> None:
    """End every unfinished descendant with the code this run's outcome gives (DESIGN §3)."""
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
            _end(child, status, code=code, reason=reason, by=SYSTEM, now=now, cascade=False)
        frontier = [child.pk for child in children]


# --- create ---------------------------------------------------------------------------------


def run_create(
    *,
    owner: User,
    agent: str,
    input: dict[str, Any],
    parent_id: UUID | str | None = None,
    max_steps: int | None = None,
    max_events: int | None = None,
    max_attempts: int | None = None,
    deadline: datetime | None = None,
) -> Run:
    _check_create(agent=agent, input=input, max_steps=max_steps, max_events=max_events, max_attempts=max_attempts)
    with transaction.atomic(durable=True):
        return _insert_run(
            owner=owner,
            agent=agent,
            input=input,
            parent_id=parent_id,
            max_steps=max_steps,
            max_events=max_events,
            max_attempts=max_attempts,
            deadline=deadline,
        )


def _check_create(
    *, agent: str, input: Any, max_steps: int | None, max_events: int | None, max_attempts: int | None
) -> None:
    if not is_registered(agent):
        raise ValidationFailed(f"unknown agent {agent!r}", detail={"agent": [f"unknown agent {agent!r}"]})
    if not isinstance(input, dict):
        raise ValidationFailed("input must be a JSON object", detail={"input": ["must be a JSON object"]})
    for name, value in (("max_steps", max_steps), ("max_events", max_events), ("max_attempts", max_attempts)):
        if value is not None and value < 1:
            raise ValidationFailed(f"{name} must be at least 1", detail={name: ["must be at least 1"]})


def _insert_run(
    *,
    owner: User,
    agent: str,
    input: dict[str, Any],
    parent_id: UUID | str | None,
    max_steps: int | None,
    max_events: int | None,
    max_attempts: int | None,
    deadline: datetime | None,
) -> Run:
    """Insert a checked run and its `run.created` event inside the caller's transaction."""
    if parent_id is not None:
        # Locking the parent serialises this insert against the parent ending, so a child
        # is never created under a terminal parent.
        parent = _lock(parent_id)
        if parent.is_terminal:
            raise InvalidTransition(parent.status, "a parent of a new run", run=parent)
    return _new_run(
        owner_id=owner.pk,
        agent=agent,
        input=input,
        parent_id=parent_id,
        max_steps=max_steps,
        max_events=max_events,
        max_attempts=max_attempts,
        deadline=deadline,
        now=timezone.now(),
    )


def _new_run(
    *,
    owner_id: Any,
    agent: str,
    input: dict[str, Any],
    parent_id: UUID | str | None,
    now: datetime,
    max_steps: int | None = None,
    max_events: int | None = None,
    max_attempts: int | None = None,
    deadline: datetime | None = None,
) -> Run:
    """The queued run and its `run.created` event; the caller holds the parent's lock, if any."""
    run = Run(
        owner_id=owner_id,
        agent=agent,
        input=input,
        parent_id=parent_id,
        max_steps=max_steps,
        max_events=max_events,
        deadline=deadline,
        created_at=now,
        updated_at=now,
    )
    if max_attempts is not None:
        run.max_attempts = max_attempts
    run.save(force_insert=True)
    created = {"agent": agent, "input_keys": sorted(input), "parent": str(parent_id) if parent_id else None}
    _append(run, [("run.created", created)], attempt=None, now=now)
    run.save(update_fields=["last_seq"])
    notify.run_queued(run.id)
    return run


# --- execution: claim, append, heartbeat, wait, complete, fail, requeue, release ---------------


def run_claim(*, worker: str) -> tuple[Run, RunAttempt] | None:
    """Take the oldest queued run nobody else is taking and open its next attempt.

    A run past its deadline is left for the sweeper to stop, never started."""
    with transaction.atomic(durable=True):
        run = (
            Run.objects.select_for_update(no_key=True, skip_locked=True)
            .filter(status=Status.QUEUED)
            .filter(Q(deadline__isnull=True) | Q(deadline__gt=Now()))
            .order_by("created_at", "id")
            .first()
        )
        if run is None:
            return None
        # Read once the run is ours: the attempt is claimed after whatever requeued the run.
        now = _db_now()
        _check(run, Status.RUNNING)
        run.status = Status.RUNNING
        run.generation += 1
        run.started_at = run.started_at or now
        run.updated_at = now
        attempt = RunAttempt.objects.create(
            run=run,
            generation=run.generation,
            worker=worker,
            claimed_at=now,
            heartbeat_at=now,
            lease_expires_at=now + timedelta(seconds=settings.RUNLEDGER_LEASE_SECONDS),
        )
        _append(
            run, [("run.started", {"generation": run.generation, "worker": worker})], attempt=run.generation, now=now
        )
        run.save(update_fields=["status", "generation", "started_at", "updated_at", "last_seq"])
    return run, attempt


def _lock_current(run_id: UUID | str, generation: int) -> Run:
    """Lock the run and fence the caller: only its current, running attempt may write."""
    run = _lock(run_id)
    if run.status != Status.RUNNING or run.generation != generation:
        raise StaleAttempt(
            f"attempt {generation} of run {run_id} is no longer current (run is {run.status}, "
            f"attempt {run.generation})",
            run=run,
        )
    return run


def run_events_append(
    *,
    run_id: UUID | str,
    generation: int,
    events: Sequence[tuple[str, dict[str, Any]]],
    after_seq: int | None = None,
) -> list[RunEvent]:
    """Append the current attempt's events, counted against the run's `max_events` budget.

    `after_seq` is the run's last seq as the attempt knows it. While an attempt is current only it
    appends, so a different `last_seq` means an earlier try of this very append committed (its
    connection dropped before the answer came back): the stored events are returned and nothing is
    written twice. Without it, a retried append could store its events twice.

    An append that exceeds `max_events` stores the events that fit, stops the run with
    `budget_exhausted` in the same transaction, and then raises `StaleAttempt`: the attempt must
    stop. A stale attempt (older generation, run no longer running) raises it and writes nothing.
    """
    for type_, data in events:
        if type_ in LIFECYCLE_TYPES or not type_:
            raise ValidationFailed(f"an agent cannot append {type_!r} events")
        if not isinstance(data, dict):
            raise ValidationFailed("event data must be a JSON object")
    if not events:
        return []
    exhausted: StaleAttempt | None = None
    with transaction.atomic(durable=True):
        run = _lock_current(run_id, generation)
        if after_seq is not None and run.last_seq != after_seq:
            return _append_replayed(run, generation=generation, events=events, after_seq=after_seq)
        now = timezone.now()
        room = len(events) if run.max_events is None else max(0, run.max_events - run.events_used)
        rows = _append(run, events[:room], attempt=generation, now=now) if room else []
        run.events_used += len(rows)
        run.updated_at = now
        run.save(update_fields=["last_seq", "events_used", "updated_at"])
        if room < len(events):
            exhausted = _exhaust(run, "max_events", now=now)
    if exhausted is not None:
        raise exhausted
    return rows


def _json(value: Any) -> Any:
    """`value` as it reads back from a JSON column (tuples become lists, and so on)."""
    return json.loads(json.dumps(value))


def _append_replayed(
    run: Run, *, generation: int, events: Sequence[tuple[str, dict[str, Any]]], after_seq: int
) -> list[RunEvent]:
    stored = list(RunEvent.objects.filter(run=run, seq__gt=after_seq).order_by("seq"))
    if [(e.type, e.data, e.attempt) for e in stored] == [(t, _json(d), generation) for t, d in events]:
        return stored
    raise StaleAttempt(
        f"attempt {generation} of run {run.pk} expected last seq {after_seq}, the run has {run.last_seq}", run=run
    )


def _exhaust(run: Run, budget: str, *, now: datetime) -> StaleAttempt:
    """Stop the locked run whose `budget` an attempt's write would exceed; the error to raise
    once the transaction has committed."""
    limit = run.max_events if budget == "max_events" else run.max_steps
    reason = f"{budget} budget of {limit} exhausted"
    # Written by the platform (attempt null), like the sweeper's stops; the worker records its
    # own release once it has stopped.
    _end(run, Status.STOPPED, code=StopCode.BUDGET_EXHAUSTED, reason=reason, by=SYSTEM, now=now)
    return StaleAttempt(f"run {run.pk} stopped: {reason}", run=run)


def run_attempt_heartbeat(*, run_id: UUID | str, generation: int) -> bool:
    """Renew the lease of a still-open attempt. False means the attempt is no longer the run's:
    the worker must stop executing it."""
    now = _db_now()
    renewed = RunAttempt.objects.filter(run_id=run_id, generation=generation, outcome=AttemptOutcome.RUNNING).update(
        heartbeat_at=now, lease_expires_at=now + timedelta(seconds=settings.RUNLEDGER_LEASE_SECONDS)
    )
    return renewed == 1


def run_attempt_release(
    *,
    run_id: UUID | str,
    generation: int,
    outcome: AttemptOutcome | None = None,
    released_at: datetime | None = None,
) -> None:
    """Record that the worker has stopped executing the attempt (the run may have ended before).

    `released_at` is when it stopped, if that was before this call (a worker that stopped while
    the database was unreachable records it once it is back). Idempotent: a release is recorded once.
    """
    changes: dict[str, Any] = {"released_at": released_at or timezone.now()}
    qs = RunAttempt.objects.filter(run_id=run_id, generation=generation, released_at__isnull=True)
    if outcome is not None:
        # Only an attempt nobody closed yet takes the worker's outcome (e.g. abandoned).
        qs.filter(outcome=AttemptOutcome.RUNNING).update(outcome=outcome, **changes)
    qs.update(**changes)


def run_wait(*, run_id: UUID | str, generation: int, reason: str, prompt: str | None = None) -> Run:
    """The worker parks the run at a safe boundary and releases it; a resume ticket is issued."""
    if reason not in ("paused", "input_required"):
        raise ValidationFailed(f"unknown wait reason {reason!r}")
    with transaction.atomic(durable=True):
        run = _lock_current(run_id, generation)
        now = timezone.now()
        _check(run, Status.WAITING)
        run.status = Status.WAITING
        run.resume_ticket = _ticket()
        run.pause_requested_at = None
        run.updated_at = now
        _append(run, [("run.waiting", {"reason": reason, "prompt": prompt})], attempt=generation, now=now)
        run.save(update_fields=["status", "resume_ticket", "pause_requested_at", "updated_at", "last_seq"])
        _close_attempt(run, AttemptOutcome.WAITING, now=now, released=True)
        notify.control_changed(run.id)
    return run


def run_complete(*, run_id: UUID | str, generation: int, output: Any) -> Run:
    with transaction.atomic(durable=True):
        run = _lock_current(run_id, generation)
        _end(
            run, Status.COMPLETED, code="", reason="", by=SYSTEM, now=timezone.now(), attempt=generation, output=output
        )
    return run


def run_fail(*, run_id: UUID | str, generation: int, code: FailCode, reason: str, error: Any = None) -> Run:
    with transaction.atomic(durable=True):
        run = _lock_current(run_id, generation)
        _end(
            run, Status.FAILED, code=code, reason=reason, by=SYSTEM, now=timezone.now(), attempt=generation, error=error
        )
    return run


def run_requeue(*, run_id: UUID | str, generation: int, cause: str) -> Run:
    """End an attempt that did not finish: a clean shutdown (`worker_shutdown`, not counted) or a
    lost lease (`lease_expired`, counted against `max_attempts`; past it the run fails)."""
    if cause not in ("worker_shutdown", "lease_expired"):
        raise ValidationFailed(f"unknown requeue cause {cause!r}")
    with transaction.atomic(durable=True):
        run = _lock_current(run_id, generation)
        _requeue(run, cause=cause, now=timezone.now())
    return run


def _requeue(run: Run, *, cause: str, now: datetime) -> None:
    """Requeue the locked running run, whose current attempt ended without finishing."""
    generation = run.generation
    if cause == "lease_expired":
        # Lost, whether its worker died or gave it up (abandoned) once it could not renew the
        # lease. The worker, if alive, records released_at itself.
        RunAttempt.objects.filter(
            run=run, generation=generation, outcome__in=[AttemptOutcome.RUNNING, AttemptOutcome.ABANDONED]
        ).update(outcome=AttemptOutcome.LOST)
        run.lost_attempts += 1
        if run.lost_attempts >= run.max_attempts:
            run.save(update_fields=["lost_attempts"])
            _end(
                run,
                Status.FAILED,
                code=FailCode.WORKER_LOST,
                reason=f"{run.lost_attempts} of {run.max_attempts} attempts lost their worker",
                by=SYSTEM,
                now=now,
            )
            return
    else:
        _close_attempt(run, AttemptOutcome.SHUTDOWN, now=now, released=True)
    if run.pause_requested_at is not None:
        # The pause its caller was answered 202 for still happens: the attempt ended at a
        # boundary of its own, so the run parks there instead of queuing.
        _check(run, Status.WAITING)
        run.status = Status.WAITING
        run.resume_ticket = _ticket()
        run.pause_requested_at = None
        run.updated_at = now
        _append(run, [("run.waiting", {"reason": "paused", "prompt": None})], attempt=None, now=now)
        run.save(
            update_fields=["status", "resume_ticket", "lost_attempts", "pause_requested_at", "updated_at", "last_seq"]
        )
        notify.control_changed(run.id)
        return
    _check(run, Status.QUEUED)
    run.status = Status.QUEUED
    run.pause_requested_at = None
    run.updated_at = now
    _append(run, [("run.requeued", {"generation": generation, "cause": cause})], attempt=None, now=now)
    run.save(update_fields=["status", "lost_attempts", "pause_requested_at", "updated_at", "last_seq"])
    notify.run_queued(run.id)


def run_steps_record(*, run_id: UUID | str, generation: int, steps: int, after_steps: int | None = None) -> Run:
    """Count `steps` agent steps (model turns, tool calls) of the current attempt against the run's
    `max_steps` budget, which spans attempts. Fenced like an append.

    `after_steps` is `steps_used` as the attempt knows it: a retry of a record that committed
    counts nothing twice. Steps beyond the budget are not counted; the run is stopped with
    `budget_exhausted` and `StaleAttempt` raised once that has committed.
    """
    if steps < 1:
        raise ValidationFailed("steps must be at least 1")
    exhausted: StaleAttempt | None = None
    with transaction.atomic(durable=True):
        run = _lock_current(run_id, generation)
        if after_steps is not None and run.steps_used != after_steps:
            if run.steps_used == after_steps + steps:
                return run  # an earlier try of this record committed
            raise StaleAttempt(
                f"attempt {generation} of run {run_id} expected {after_steps} steps used, the run has {run.steps_used}",
                run=run,
            )
        now = timezone.now()
        room = steps if run.max_steps is None else max(0, run.max_steps - run.steps_used)
        run.steps_used += min(steps, room)
        run.updated_at = now
        run.save(update_fields=["steps_used", "updated_at"])
        if room < steps:
            exhausted = _exhaust(run, "max_steps", now=now)
    if exhausted is not None:
        raise exhausted
    return run


def run_child_spawn(
    *,
    run_id: UUID | str,
    generation: int,
    input: dict[str, Any],
    agent: str | None = None,
    after_seq: int | None = None,
) -> Run:
    """The current attempt of a run creates a child run (of its own agent unless told), owned by
    the parent's owner. The parent's `child.spawned` event is written in the same transaction, so
    a later attempt finds the child in its stored events and never spawns it twice.

    The event counts against the parent's `max_events`: past it the parent is stopped
    (`budget_exhausted`), no child is made, and `StaleAttempt` is raised. `after_seq` makes a retry
    safe as in `run_events_append`: it returns the child an earlier try committed."""
    if not isinstance(input, dict):
        raise ValidationFailed("input must be a JSON object", detail={"input": ["must be a JSON object"]})
    exhausted: StaleAttempt | None = None
    with transaction.atomic(durable=True):
        # Locks the parent first (ancestor before descendant, as everywhere) and fences the
        # attempt: a child is never created under a terminal parent or by a stale attempt.
        parent = _lock_current(run_id, generation)
        if after_seq is not None and parent.last_seq != after_seq:
            return _spawn_replayed(parent, generation=generation, after_seq=after_seq)
        child_agent = agent or parent.agent
        if not is_registered(child_agent):
            raise ValidationFailed(
                f"unknown agent {child_agent!r}", detail={"agent": [f"unknown agent {child_agent!r}"]}
            )
        now = timezone.now()
        if parent.max_events is not None and parent.events_used >= parent.max_events:
            exhausted = _exhaust(parent, "max_events", now=now)
        else:
            child = _new_run(owner_id=parent.owner_id, agent=child_agent, input=input, parent_id=parent.pk, now=now)
            spawned = {"run_id": str(child.pk), "agent": child_agent}
            _append(parent, [("child.spawned", spawned)], attempt=generation, now=now)
            parent.events_used += 1
            parent.updated_at = now
            parent.save(update_fields=["last_seq", "events_used", "updated_at"])
    if exhausted is not None:
        raise exhausted
    return child


def _spawn_replayed(parent: Run, *, generation: int, after_seq: int) -> Run:
    last = RunEvent.objects.filter(run=parent, seq=after_seq + 1).first()
    if (
        parent.last_seq == after_seq + 1
        and last is not None
        and (last.type, last.attempt) == ("child.spawned", generation)
    ):
        return Run.objects.get(pk=last.data["run_id"])
    raise StaleAttempt(
        f"attempt {generation} of run {parent.pk} expected last seq {after_seq}, the run has {parent.last_seq}",
        run=parent,
    )


# --- the sweeper: lapsed leases, deadlines -----------------------------------------------------


@dataclass(frozen=True)
class SweepResult:
    requeued: tuple[UUID, ...] = ()
    # Failed with worker_lost: their lost attempts reached max_attempts.
    failed: tuple[UUID, ...] = ()
    # Stopped with deadline_exceeded.
    stopped: tuple[UUID, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.requeued or self.failed or self.stopped)


_LIVE = (Status.QUEUED, Status.RUNNING, Status.WAITING)


def _lock_or_skip(run_id: UUID | str) -> Run | None:
    """Lock the run unless another transaction holds it (another sweeper, or a command that will
    leave it changed): then None, and the next sweep looks again."""
    return Run.objects.select_for_update(no_key=True, skip_locked=True).filter(pk=run_id).first()


def run_lease_expire(*, run_id: UUID | str, generation: int, as_of: datetime | None = None) -> Run | None:
    """Requeue a running run whose attempt `generation` let its lease lapse (`lease_expired`, one
    more lost attempt), or fail it with `worker_lost` once `max_attempts` are lost.

    The lease is re-checked under the run's lock (and the attempt row's, which a heartbeat
    updates), so a lease renewed meanwhile, a run that moved on, or one another sweeper is
    handling is left alone: None. `as_of` replaces the database clock (tests)."""
    with transaction.atomic(durable=True):
        run = _lock_or_skip(run_id)
        if run is None or run.status != Status.RUNNING or run.generation != generation:
            return None
        attempt = RunAttempt.objects.select_for_update(no_key=True).filter(run=run, generation=generation).first()
        now = _db_now()
        if attempt is None or attempt.lease_expires_at >= (as_of or now):
            return None
        _requeue(run, cause="lease_expired", now=now)
    return run


def run_deadline_stop(*, run_id: UUID | str, as_of: datetime | None = None) -> Run | None:
    """Stop a queued, running or waiting run past its deadline (`deadline_exceeded`, by system);
    its unfinished descendants are stopped with it. None when there is nothing to do."""
    with transaction.atomic(durable=True):
        run = _lock_or_skip(run_id)
        if run is None or run.is_terminal or run.deadline is None:
            return None
        now = _db_now()
        if run.deadline > (as_of or now):
            return None
        reason = f"deadline {run.deadline.isoformat()} passed"
        _end(run, Status.STOPPED, code=StopCode.DEADLINE_EXCEEDED, reason=reason, by=SYSTEM, now=now)
    return run


def runs_sweep(*, as_of: datetime | None = None, batch_size: int = 100) -> SweepResult:
    """Requeue (or fail) running runs whose lease lapsed and stop live runs past their deadline.

    Every worker sweeps, so any number may run this at once: candidates are read without locks,
    then each run is handled in its own short transaction under its row lock, taken with SKIP
    LOCKED, and re-checked there. However many sweepers find a run, it is requeued or stopped once.
    `as_of` replaces the database clock (tests).
    """
    requeued: list[UUID] = []
    failed: list[UUID] = []
    stopped: list[UUID] = []
    seen: set[tuple[UUID, int]] = set()
    while True:
        # From the running runs (few) to their current attempt. Not by the attempt's outcome: an
        # attempt its worker gave up (abandoned) still holds the run until its lease lapses.
        expired = [
            key
            for key in RunAttempt.objects.filter(
                run__status=Status.RUNNING,
                generation=F("run__generation"),
                lease_expires_at__lt=as_of or _db_now(),
            )
            .order_by("lease_expires_at")
            .values_list("run_id", "generation")[: batch_size + len(seen)]
            if key not in seen
        ][:batch_size]
        for run_id, generation in expired:
            seen.add((run_id, generation))
            run = run_lease_expire(run_id=run_id, generation=generation, as_of=as_of)
            if run is not None:
                (failed if run.status == Status.FAILED else requeued).append(run.pk)
        if len(expired) < batch_size:
            break
    seen_overdue: set[UUID] = set()
    while True:
        overdue = [
            run_id
            for run_id in Run.objects.filter(status__in=_LIVE, deadline__lt=as_of or _db_now())
            .order_by("deadline")
            .values_list("pk", flat=True)[: batch_size + len(seen_overdue)]
            if run_id not in seen_overdue
        ][:batch_size]
        for run_id in overdue:
            seen_overdue.add(run_id)
            if run_deadline_stop(run_id=run_id, as_of=as_of) is not None:
                stopped.append(run_id)
        if len(overdue) < batch_size:
            break
    return SweepResult(requeued=tuple(requeued), failed=tuple(failed), stopped=tuple(stopped))


# --- commands: cancel, stop, pause, resume -----------------------------------------------------


def run_cancel(*, run_id: UUID | str, actor: User, note: str = "") -> CommandResult:
    with transaction.atomic(durable=True):
        run = _lock(run_id)
        if run.status == Status.CANCELLED:
            return CommandResult(run=run, changed=False)
        # Cancelling one's own run is a user cancel even for holders of runs.cancel_run.
        code = CancelCode.BY_USER if actor.pk == run.owner_id else CancelCode.BY_STAFF
        _end(run, Status.CANCELLED, code=code, reason=note, by=_username(actor), now=timezone.now())
    return CommandResult(run=run, changed=True)


def run_stop(*, run_id: UUID | str, actor: User | None, code: str = StopCode.STAFF, reason: str) -> CommandResult:
    if code not in CALLER_STOP_CODES:
        allowed = ", ".join(sorted(CALLER_STOP_CODES))
        raise ValidationFailed(f"stop code must be one of {allowed}", detail={"code": [f"must be one of {allowed}"]})
    if not reason or not reason.strip():
        raise ValidationFailed("a stop needs a reason", detail={"reason": ["this field is required"]})
    with transaction.atomic(durable=True):
        run = _lock(run_id)
        if run.status == Status.STOPPED:
            return CommandResult(run=run, changed=False)
        _end(run, Status.STOPPED, code=code, reason=reason, by=_username(actor), now=timezone.now())
    return CommandResult(run=run, changed=True)


def run_pause(*, run_id: UUID | str) -> CommandResult:
    with transaction.atomic(durable=True):
        run = _lock(run_id)
        now = timezone.now()
        if run.status == Status.WAITING:
            return CommandResult(run=run, changed=False)
        if run.status == Status.RUNNING:
            if run.pause_requested_at is not None:
                return CommandResult(run=run, changed=False, pending=True)
            run.pause_requested_at = now
            run.updated_at = now
            run.save(update_fields=["pause_requested_at", "updated_at"])
            notify.control_changed(run.id)
            return CommandResult(run=run, changed=True, pending=True)
        _check(run, Status.WAITING)  # queued → waiting at once; terminal raises
        run.status = Status.WAITING
        run.resume_ticket = _ticket()
        run.updated_at = now
        _append(run, [("run.waiting", {"reason": "paused", "prompt": None})], attempt=None, now=now)
        run.save(update_fields=["status", "resume_ticket", "updated_at", "last_seq"])
    return CommandResult(run=run, changed=True)


def run_resume(*, run_id: UUID | str, ticket: str, input: Any = None) -> Run:
    if not ticket:
        raise ValidationFailed("a resume needs the run's ticket", detail={"ticket": ["this field is required"]})
    with transaction.atomic(durable=True):
        run = _lock(run_id)
        if run.status != Status.WAITING or not secrets.compare_digest(run.resume_ticket.encode(), ticket.encode()):
            raise StaleTicket("the resume ticket is stale, used or invalidated", run=run)
        now = timezone.now()
        run.status = Status.QUEUED
        run.resume_ticket = ""
        run.updated_at = now
        _append(run, [("run.resumed", {"ticket": ticket, "input": input})], attempt=None, now=now)
        run.save(update_fields=["status", "resume_ticket", "updated_at", "last_seq"])
        notify.run_queued(run.id)
    return run


# --- create through the API: parent visibility and Idempotency-Key ----------------------------


@dataclass(frozen=True)
class CreateResponse:
    """The response to a create: fresh, or the stored first success replayed for a retried key."""

    status: int
    body: Any
    replayed: bool = False


def run_create_idempotent(
    *,
    owner: AbstractUser,
    key: str | None,
    request_body: Any,
    render: Callable[[Run], Any],
    agent: str,
    input: dict[str, Any],
    parent_id: UUID | str | None = None,
    max_steps: int | None = None,
    max_events: int | None = None,
    max_attempts: int | None = None,
    deadline: datetime | None = None,
) -> CreateResponse:
    """Create a run for `owner` and answer with `render(run)`; with a key, at most once per
    (owner, key) for RUNLEDGER_IDEMPOTENCY_TTL_SECONDS.

    The record and the run commit in one transaction, so a failed create leaves no record (and is
    not replayed), and a concurrent retry with the same key waits on the record's unique index
    until the first commits (PostgreSQL), or at BEGIN IMMEDIATE (SQLite), then replays it.
    """
    _check_create(agent=agent, input=input, max_steps=max_steps, max_events=max_events, max_attempts=max_attempts)
    # Someone else's run as parent is refused as bad input, never revealed as a 404 or a 409.
    if parent_id is not None and not run_visible(user=owner).filter(pk=parent_id).exists():
        raise ValidationFailed("parent run not found", detail={"parent": [f"no run {parent_id} visible to you"]})
    fields: dict[str, Any] = {
        "owner": owner,
        "agent": agent,
        "input": input,
        "parent_id": parent_id,
        "max_steps": max_steps,
        "max_events": max_events,
        "max_attempts": max_attempts,
        "deadline": deadline,
    }
    if key is None:
        return CreateResponse(status=201, body=render(run_create(**fields)))
    for _ in range(2):
        replay = _idempotent_replay(owner=owner, key=key, request_body=request_body)
        if replay is not None:
            return replay
        try:
            with transaction.atomic(durable=True):
                # Inserted first: a concurrent request with the same key blocks here until we end.
                record = IdempotencyRecord.objects.create(
                    user_id=owner.pk, key=key, request_body=request_body, created_at=timezone.now()
                )
                run = _insert_run(**fields)
                body = render(run)
                record.response_status = 201
                record.response_body = body
                record.run = run
                record.save(update_fields=["response_status", "response_body", "run"])
            return CreateResponse(status=201, body=body)
        except IntegrityError:
            # The key was committed by a request that got there first: replay it on the next turn.
            continue
    raise RuntimeError(f"idempotency key {key!r} of user {owner.pk} neither replays nor inserts")


def _idempotent_replay(*, owner: AbstractUser, key: str, request_body: Any) -> CreateResponse | None:
    record = IdempotencyRecord.objects.filter(user_id=owner.pk, key=key).first()
    if record is None:
        return None
    if record.created_at <= timezone.now() - timedelta(seconds=settings.RUNLEDGER_IDEMPOTENCY_TTL_SECONDS):
        # Expired: the key is free again. Deleting by (pk, created_at) leaves a fresh record alone.
        IdempotencyRecord.objects.filter(pk=record.pk, created_at=record.created_at).delete()
        return None
    if not _same_json(record.request_body, request_body):
        raise IdempotencyMismatch(
            "this Idempotency-Key was already used with a different request body",
            detail={"idempotency_key": key},
        )
    assert record.response_status is not None  # stored in the transaction that inserted the record
    return CreateResponse(status=record.response_status, body=record.response_body, replayed=True)


def _same_json(a: Any, b: Any) -> bool:
    """Equality as JSON values: 1 == 1.0 (a JSON number), but true is not 1, key order is ignored."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


# --- retention -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PurgeResult:
    runs: int
    events: int
    attempts: int
    batches: int


def _purge_blocked(*, ended_before: datetime) -> set[UUID]:
    """Qualifying runs that must stay because a descendant does not qualify.

    Deleting a run deletes its whole subtree (the parent foreign key cascades), so a run goes only
    when every descendant qualifies too. A terminal parent's descendants normally ended with it or
    before, so this is empty unless clocks disagreed between machines; it is checked anyway.
    """
    qualifying = Run.objects.filter(status__in=TERMINAL, ended_at__lt=ended_before)
    blocked: set[UUID] = set()
    frontier = set(
        Run.objects.filter(parent__in=qualifying).exclude(pk__in=qualifying).values_list("parent_id", flat=True)
    )
    while frontier:
        blocked |= frontier
        parents = Run.objects.filter(pk__in=frontier, parent_id__isnull=False).values_list("parent_id", flat=True)
        frontier = set(parents) - blocked
    return blocked


def runs_purge(*, ended_before: datetime, batch_size: int = 500, dry_run: bool = False) -> PurgeResult:
    """Delete terminal runs that ended before `ended_before`, with their events and attempts.

    Live runs (queued, running, waiting) are never touched: only terminal rows qualify, and a
    terminal state is absorbing, so a run selected here cannot come back to life before it goes.
    Each batch is its own transaction, so a large purge never holds one long lock.
    """
    if batch_size < 1:
        raise ValidationFailed("batch_size must be at least 1")
    deletable = Run.objects.filter(status__in=TERMINAL, ended_at__lt=ended_before).exclude(
        pk__in=_purge_blocked(ended_before=ended_before)
    )
    if dry_run:
        selected = deletable.values("pk")
        return PurgeResult(
            runs=deletable.count(),
            events=RunEvent.objects.filter(run_id__in=selected).count(),
            attempts=RunAttempt.objects.filter(run_id__in=selected).count(),
            batches=0,
        )
    runs = events = attempts = batches = 0
    while True:
        with transaction.atomic(durable=True):
            ids = list(deletable.order_by("ended_at", "id").values_list("pk", flat=True)[:batch_size])
            if not ids:
                break
            # Children of a deletable run are deletable too; the cascade takes them in this batch.
            _, per_model = Run.objects.filter(pk__in=ids).delete()
        runs += per_model.get(Run._meta.label, 0)
        events += per_model.get(RunEvent._meta.label, 0)
        attempts += per_model.get(RunAttempt._meta.label, 0)
        batches += 1
    return PurgeResult(runs=runs, events=events, attempts=attempts, batches=batches)
