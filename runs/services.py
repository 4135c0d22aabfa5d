"""Every write to runs, events and attempts.

Each command is one transaction: lock the run row (`FOR NO KEY UPDATE`, so event and child inserts,
which take `FOR KEY SHARE` on it through their foreign key, are not blocked), check the transition
in `transitions`, write the run and its event(s) together, and notify — `pg_notify` inside the
transaction is delivered only at commit, so no other process hears of a write that rolled back.
On SQLite `select_for_update` is a no-op; IMMEDIATE transactions serialise the writers instead.
"""

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from django.utils import timezone

from runs import notify
from runs.agents import is_registered
from runs.exceptions import InvalidTransition, NotFound, StaleAttempt, StaleTicket, ValidationFailed
from runs.models import AttemptOutcome, Run, RunAttempt, RunEvent
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
    if not is_registered(agent):
        raise ValidationFailed(f"unknown agent {agent!r}", detail={"agent": [f"unknown agent {agent!r}"]})
    if not isinstance(input, dict):
        raise ValidationFailed("input must be a JSON object", detail={"input": ["must be a JSON object"]})
    for name, value in (("max_steps", max_steps), ("max_events", max_events), ("max_attempts", max_attempts)):
        if value is not None and value < 1:
            raise ValidationFailed(f"{name} must be at least 1", detail={name: ["must be at least 1"]})
    with transaction.atomic(durable=True):
        now = timezone.now()
        if parent_id is not None:
            # Locking the parent serialises this insert against the parent ending, so a child
            # is never created under a terminal parent.
            parent = _lock(parent_id)
            if parent.is_terminal:
                raise InvalidTransition(parent.status, "a parent of a new run", run=parent)
        run = Run(
            owner_id=owner.pk,
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
    """Take the oldest queued run nobody else is taking and open its next attempt."""
    with transaction.atomic(durable=True):
        run = (
            Run.objects.select_for_update(no_key=True, skip_locked=True)
            .filter(status=Status.QUEUED)
            .order_by("created_at", "id")
            .first()
        )
        if run is None:
            return None
        now = timezone.now()
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
    *, run_id: UUID | str, generation: int, events: Sequence[tuple[str, dict[str, Any]]]
) -> list[RunEvent]:
    for type_, data in events:
        if type_ in LIFECYCLE_TYPES or not type_:
            raise ValidationFailed(f"an agent cannot append {type_!r} events")
        if not isinstance(data, dict):
            raise ValidationFailed("event data must be a JSON object")
    if not events:
        return []
    with transaction.atomic(durable=True):
        run = _lock_current(run_id, generation)
        now = timezone.now()
        rows = _append(run, events, attempt=generation, now=now)
        run.events_used += len(rows)
        run.updated_at = now
        run.save(update_fields=["last_seq", "events_used", "updated_at"])
    return rows


def run_attempt_heartbeat(*, run_id: UUID | str, generation: int) -> bool:
    """Renew the lease of a still-open attempt. False means the attempt is no longer the run's:
    the worker must stop executing it."""
    now = timezone.now()
    renewed = RunAttempt.objects.filter(run_id=run_id, generation=generation, outcome=AttemptOutcome.RUNNING).update(
        heartbeat_at=now, lease_expires_at=now + timedelta(seconds=settings.RUNLEDGER_LEASE_SECONDS)
    )
    return renewed == 1


def run_attempt_release(*, run_id: UUID | str, generation: int, outcome: AttemptOutcome | None = None) -> None:
    """Record that the worker has stopped executing the attempt (the run may have ended before)."""
    changes: dict[str, Any] = {"released_at": timezone.now()}
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
    lost = cause == "lease_expired"
    with transaction.atomic(durable=True):
        run = _lock_current(run_id, generation)
        now = timezone.now()
        outcome = AttemptOutcome.LOST if lost else AttemptOutcome.SHUTDOWN
        if lost:
            run.lost_attempts += 1
            if run.lost_attempts >= run.max_attempts:
                _close_attempt(run, outcome, now=now, released=False)
                run.save(update_fields=["lost_attempts"])
                _end(
                    run,
                    Status.FAILED,
                    code=FailCode.WORKER_LOST,
                    reason=f"{run.lost_attempts} of {run.max_attempts} attempts lost their worker",
                    by=SYSTEM,
                    now=now,
                )
                return run
        _check(run, Status.QUEUED)
        _close_attempt(run, outcome, now=now, released=not lost)
        run.status = Status.QUEUED
        run.pause_requested_at = None
        run.updated_at = now
        _append(run, [("run.requeued", {"generation": generation, "cause": cause})], attempt=None, now=now)
        run.save(update_fields=["status", "lost_attempts", "pause_requested_at", "updated_at", "last_seq"])
        notify.run_queued(run.id)
    return run


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
        if run.status != Status.WAITING or not secrets.compare_digest(run.resume_ticket, ticket):
            raise StaleTicket("the resume ticket is stale, used or invalidated", run=run)
        now = timezone.now()
        run.status = Status.QUEUED
        run.resume_ticket = ""
        run.updated_at = now
        _append(run, [("run.resumed", {"ticket": ticket, "input": input})], attempt=None, now=now)
        run.save(update_fields=["status", "resume_ticket", "updated_at", "last_seq"])
        notify.run_queued(run.id)
    return run
