"""The sweeper every worker runs: lapsed leases and passed deadlines
(docs/design/execution.md#sweeper), and the tool processes lost attempts left on the sweeper's
machine (`runs.worker.orphans`)."""

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from django.db import transaction
from django.db.models import F, Q

from runs.events import RequeueCause
from runs.metrics import series
from runs.models import AttemptOutcome, Run, RunAttempt
from runs.selectors.clock import db_now
from runs.services.core import SYSTEM, end, lock_or_skip, requeue
from runs.transitions import Status, StopCode


@dataclass(frozen=True)
class SweepResult:
    requeued: tuple[UUID, ...] = ()
    # Failed with worker_lost: their lost attempts reached max_attempts.
    failed: tuple[UUID, ...] = ()
    # Stopped with deadline_exceeded.
    stopped: tuple[UUID, ...] = ()
    # Attempts of ended runs whose worker never recorded its release and whose lease lapsed.
    released: int = 0

    def __bool__(self) -> bool:
        return bool(self.requeued or self.failed or self.stopped or self.released)


_LIVE = (Status.QUEUED, Status.RUNNING, Status.WAITING)
# Outcomes of attempts whose run was cancelled or stopped under them (runledger_cancel_release_seconds).
_CANCEL_OUTCOMES = (AttemptOutcome.CANCELLED, AttemptOutcome.STOPPED)


def run_lease_expire(*, run_id: UUID | str, generation: int, as_of: datetime | None = None) -> Run | None:
    """Requeue a running run whose attempt `generation` let its lease lapse (`lease_expired`, one
    more lost attempt), or fail it with `worker_lost` once `max_attempts` are lost.

    The lease is re-checked under the run's lock (and the attempt row's, which a heartbeat
    updates), so a lease renewed meanwhile, a run that moved on, or one another sweeper is
    handling is left alone: None. `as_of` replaces the database clock (tests)."""
    with transaction.atomic(durable=True):
        run = lock_or_skip(run_id)
        if run is None or run.status != Status.RUNNING or run.generation != generation:
            return None
        attempt = RunAttempt.objects.select_for_update(no_key=True).filter(run=run, generation=generation).first()
        now = db_now()
        if attempt is None or attempt.lease_expires_at >= (as_of or now):
            return None
        requeue(run, cause=RequeueCause.LEASE_EXPIRED, now=now)
    return run


def run_attempts_release_lapsed(*, as_of: datetime | None = None) -> int:
    """Release the attempts a run left (it was cancelled or stopped under them) whose worker never
    said it stopped and whose lease has lapsed: the worker died, or lost the database. A worker
    fences itself before its lease lapses, so by `lease_expires_at` it certainly stopped; that is
    their `released_at`, and their outcome `lost`. (Attempts still holding their run are the
    requeue's, in `run_lease_expire`.)"""
    with transaction.atomic(durable=True):
        # Locked and read first (few rows, through the unreleased index) for the metrics: each is
        # a lost attempt, and a cancelled or stopped one's release ends its cancel's latency.
        # SKIP LOCKED: of sweepers racing, one counts each attempt.
        lapsed = list(
            RunAttempt.objects.select_for_update(no_key=True, skip_locked=True, of=("self",))
            .filter(released_at__isnull=True, lease_expires_at__lt=as_of or db_now())
            .exclude(outcome=AttemptOutcome.RUNNING)
            .values_list("pk", "outcome", "lease_expires_at", "run__ended_at")
        )
        if not lapsed:
            return 0
        for _pk, outcome, lease_expires_at, ended_at in lapsed:
            if outcome in _CANCEL_OUTCOMES and ended_at is not None:
                series.cancel_released(ended_at=ended_at, released_at=lease_expires_at)
        series.attempts_lost(len(lapsed))
        return RunAttempt.objects.filter(pk__in=[row[0] for row in lapsed]).update(
            released_at=F("lease_expires_at"), outcome=AttemptOutcome.LOST
        )


def run_deadline_stop(*, run_id: UUID | str, as_of: datetime | None = None) -> Run | None:
    """Stop a queued, running or waiting run past its deadline (`deadline_exceeded`, by system);
    its unfinished descendants are stopped with it. None when there is nothing to do."""
    with transaction.atomic(durable=True):
        run = lock_or_skip(run_id)
        if run is None or run.is_terminal or run.deadline is None:
            return None
        now = db_now()
        if run.deadline > (as_of or now):
            return None
        reason = f"deadline {run.deadline.isoformat()} passed"
        end(run, Status.STOPPED, code=StopCode.DEADLINE_EXCEEDED, reason=reason, by=SYSTEM, now=now)
    return run


def runs_sweep(*, as_of: datetime | None = None, batch_size: int = 100) -> SweepResult:
    """Requeue (or fail) running runs whose lease lapsed, stop live runs past their deadline, and
    release the lapsed attempts of ended runs.

    Every worker sweeps, so any number may run this at once: candidates are read without locks,
    then each run is handled in its own short transaction under its row lock, taken with SKIP
    LOCKED, and re-checked there. However many sweepers find a run, it is requeued or stopped once.
    `as_of` replaces the database clock: the reading the worker's reap judged by (or a test's).
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
                lease_expires_at__lt=as_of or db_now(),
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
            for run_id in Run.objects.filter(status__in=_LIVE, deadline__lt=as_of or db_now())
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
    released = run_attempts_release_lapsed(as_of=as_of)
    return SweepResult(requeued=tuple(requeued), failed=tuple(failed), stopped=tuple(stopped), released=released)


@dataclass(frozen=True)
class OrphanedGroups:
    """The process groups an attempt recorded, as `[pgid, start ticks]` pairs, whose worker died
    or stalled: its lease lapsed before it was released, or it is marked lost."""

    attempt_id: int
    run_id: UUID
    generation: int
    groups: list[list[int]]


@dataclass(frozen=True)
class MachineAttempts:
    orphans: tuple[OrphanedGroups, ...]
    # The machine's attempts not released yet (running ones among them), for the next look.
    unreleased: frozenset[int]


def attempt_groups_orphaned(
    *, machine: str, watched: Collection[int] = (), all_lost: bool = False, as_of: datetime | None = None
) -> MachineAttempts:
    """The attempts on `machine` (`RunAttempt.machine`) whose recorded process groups may have
    outlived their worker, for that machine's sweeper to kill before it requeues their runs.

    Read cheaply, every sweep: the machine's unreleased attempts (the unreleased index) and the
    `watched` ones (by key: the unreleased ones of the last look, which another machine's sweeper
    may have marked lost since). `all_lost` also reads every attempt of the machine marked lost
    with groups recorded, which no index serves: once, when a worker starts."""
    if not machine:
        return MachineAttempts(orphans=(), unreleased=frozenset())
    now = as_of or db_now()
    where = Q(released_at__isnull=True) | Q(pk__in=list(watched))
    if all_lost:
        where |= Q(outcome=AttemptOutcome.LOST) & ~Q(process_groups=[])
    # Unordered: the model's ordering would join every row to its run to sort by it.
    rows = (
        RunAttempt.objects.filter(where, machine=machine)
        .order_by()
        .values_list("pk", "run_id", "generation", "released_at", "outcome", "lease_expires_at", "process_groups")
    )
    orphans: list[OrphanedGroups] = []
    unreleased: set[int] = set()
    for pk, run_id, generation, released_at, outcome, lease_expires_at, groups in rows:
        if released_at is None:
            unreleased.add(pk)
        # A worker that released its attempt stopped its groups first; one whose lease lapsed
        # unreleased is dead or stalled (a live one fences itself before).
        left_behind = (released_at is None and lease_expires_at < now) or outcome == AttemptOutcome.LOST
        if groups and left_behind:
            orphans.append(OrphanedGroups(attempt_id=pk, run_id=run_id, generation=generation, groups=groups))
    return MachineAttempts(orphans=tuple(orphans), unreleased=frozenset(unreleased))


def run_attempt_groups_forget(*, attempt_id: int, groups: Sequence[Sequence[int]]) -> None:
    """Drop `groups` from the attempt's record once its machine's sweeper killed what was left of
    them, so that no sweep looks for them again."""
    gone = [[int(n) for n in group] for group in groups]
    with transaction.atomic(durable=True):
        # The row alone, locked: a tool of a still-running worker may be adding its group.
        attempt = RunAttempt.objects.select_for_update(no_key=True).filter(pk=attempt_id).first()
        if attempt is None:
            return
        left = [group for group in attempt.process_groups if group not in gone]
        if left != attempt.process_groups:
            attempt.process_groups = left
            attempt.save(update_fields=["process_groups"])
