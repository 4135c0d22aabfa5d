"""Firing schedules (docs/design/schedules.md#firing): each due time's run created through the normal
create path, and the schedule's next due time moved, in one transaction under the schedule's row
lock — exactly once, whatever the number of workers firing. The overlap policies and catch-up."""

from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from runs.events import FireOutcome, ScheduleEvent
from runs.exceptions import RunledgerError
from runs.metrics import series
from runs.models import LIVE_VALUES, Overlap, Run, Schedule
from runs.recurrence import Rule
from runs.selectors.schedules import with_owner_and_last_run
from runs.services.core import SYSTEM, end, lock_run
from runs.services.creation import RunSpec, insert_run
from runs.services.ranking import DbNow
from runs.services.schedule_notices import tell
from runs.transitions import CancelCode, Status


def rule_of(schedule: Schedule) -> Rule:
    return Rule(
        cron=schedule.cron, every_seconds=schedule.every_seconds, zone=schedule.timezone, anchor=schedule.anchor
    )


_BEFORE = timedelta(microseconds=1)


def first_due(rule: Rule, *, now: datetime, start_at: datetime | None, end_at: datetime | None) -> datetime | None:
    """The first due time after `now`, at or after `start_at`, and not after `end_at` (None: none)."""
    return due_after(rule, max(now, start_at - _BEFORE) if start_at is not None else now, end_at=end_at)


def due_after(rule: Rule, after: datetime, *, end_at: datetime | None) -> datetime | None:
    """The due time that follows `after`, unless it is past `end_at` (None: the schedule is over)."""
    due = rule.next_after(after)
    return None if end_at is not None and due > end_at else due


@dataclass(frozen=True)
class Fired:
    due_at: datetime
    outcome: FireOutcome
    run: Run | None = None


def due_now() -> "Q":
    """Active schedules whose next due time has come, by the database's clock (`schedule_due`)."""
    return Q(paused=False, next_due_at__lte=DbNow())


# Due schedules fired in one transaction: one commit (one fsync) for many fires when many are due
# at once, while each schedule's lock is held a few milliseconds only.
FIRES_PER_TRANSACTION = 20


def schedules_fire(*, limit: int) -> int:
    """Fire what is due — due times, then `buffer_one` runs whose live run ended — until nothing is
    or `limit` were fired; how many were. The scheduler's call (runs.worker.scheduler)."""
    fired = 0
    while fired < limit and (batch := fire_due(limit=min(FIRES_PER_TRANSACTION, limit - fired))):
        fired += len(batch)
    while fired < limit and fire_buffered() is not None:
        fired += 1
    return fired


def fire_next() -> Fired | None:
    """Fire the schedule due soonest that no other transaction holds, if any."""
    fired = fire_due(limit=1)
    return fired[0] if fired else None


def fire_due(*, limit: int) -> list[Fired]:
    """Lock up to `limit` due schedules that no other transaction holds, soonest first, and fire
    each, in one transaction. Should a due time have its run already (the unique constraint), the
    same schedules are fired again one by one, each create in a savepoint."""
    picked: list[Schedule] = []
    try:
        with transaction.atomic(durable=True):
            picked = _pick(limit)
            # By owner: each create takes its owner's lock for the caps, and two batches that met
            # the same owners in different orders deadlocked (tests/schedules/test_firing_race.py).
            picked.sort(key=lambda schedule: schedule.owner_id)
            fired = [fire_locked(schedule, now=_clock(schedule)) for schedule in picked]
            _save(picked)
            return fired
    except IntegrityError:
        fired = []
        for pk in [schedule.pk for schedule in picked]:
            with transaction.atomic(durable=True):
                for schedule in _pick(1, pk=pk):
                    fired.append(fire_locked(schedule, now=_clock(schedule), guarded=True))
                    _save([schedule])
        return fired


def _save(schedules: list[Schedule]) -> None:
    """What the fires changed of the schedules, in one statement for the whole batch."""
    if schedules:
        Schedule.objects.bulk_update(schedules, ["next_due_at", "last_run", "buffered_due_at", "told"])


def fire_buffered() -> Fired | None:
    """Create the run of a `buffer_one` due time whose schedule's live run has ended, if any: one
    transaction. The end's notification wakes the schedulers (`runs.services.core.end`)."""
    with transaction.atomic(durable=True):
        waiting = Schedule.objects.select_for_update(no_key=True, skip_locked=True, of=("self",))
        ended = Q(last_run__isnull=True) | ~Q(last_run__status__in=LIVE_VALUES)
        schedule = with_owner_and_last_run(waiting).filter(ended, buffered_due_at__isnull=False).first()
        if schedule is None or schedule.buffered_due_at is None:
            return None
        now = timezone.now()
        due, schedule.buffered_due_at = schedule.buffered_due_at, None
        fired = create_run(schedule, due_at=due, now=now)
        schedule.save(update_fields=["last_run", "buffered_due_at", "told"])
        series.schedule_fired(fired.outcome, lateness=(now - due).total_seconds(), missed=0)
        return fired


def _pick(limit: int, *, pk: UUID | None = None) -> list[Schedule]:
    picked = Schedule.objects.select_for_update(no_key=True, skip_locked=True, of=("self",))
    picked = with_owner_and_last_run(picked).filter(due_now()).order_by("next_due_at")
    if pk is not None:
        picked = picked.filter(pk=pk)
    if connection.vendor == "postgresql":
        picked = picked.annotate(clock=DbNow())
    return list(picked[:limit])


def _clock(schedule: Schedule) -> datetime:
    clock: datetime | None = getattr(schedule, "clock", None)
    return clock if clock is not None else timezone.now()


def fire_locked(schedule: Schedule, *, now: datetime, guarded: bool = False) -> Fired:
    """Fire the locked, due `schedule`'s due time that catch-up chooses, and move its next due time
    past it (docs/design/schedules.md#catch-up): the latest one at or before now; with a window,
    the earliest not older than it, so that the next ones fire in order, each in its transaction.
    `guarded`: its run's create in a savepoint, which a run existing for that due time undoes. The
    caller saves the schedule (`_save`)."""
    assert schedule.next_due_at is not None
    rule = rule_of(schedule)
    horizon = min(now, schedule.end_at) if schedule.end_at is not None else now
    latest = max(rule.latest_at_or_before(horizon) or schedule.next_due_at, schedule.next_due_at)
    due = latest
    if schedule.catchup_window_seconds:
        # The oldest due time less than the window old; none such: the latest all the same.
        oldest = max(rule.next_after(now - timedelta(seconds=schedule.catchup_window_seconds)), schedule.next_due_at)
        due = min(oldest, latest)
    missed = _count_between(rule, schedule.next_due_at, due)
    fired = overlap_fire(schedule, due_at=due, now=now, guarded=guarded)
    schedule.next_due_at = due_after(rule, due, end_at=schedule.end_at)
    series.schedule_fired(fired.outcome, lateness=(now - due).total_seconds(), missed=missed)
    return fired


def _count_between(rule: Rule, first: datetime, fired: datetime, *, most: int = 1000) -> int:
    """The due times from `first` up to `fired` (excluded) that catch-up passes over, up to `most`."""
    if fired <= first:
        return 0
    if rule.every_seconds is not None:
        return min(most, round((fired - first).total_seconds() / rule.every_seconds))
    count, due = 0, first
    while due < fired and count < most:
        count, due = count + 1, rule.next_after(due)
    return count


def overlap_fire(
    schedule: Schedule, *, due_at: datetime, now: datetime, told: bool = True, guarded: bool = False
) -> Fired:
    """Fire `due_at` as the overlap policy says while the schedule's last run is live. `told`: a
    skip or a refused create is told to webhooks (the scheduler's), else a trigger's caller hears
    of it (a refusal raised)."""
    last = schedule.last_run
    live = last is not None and last.status in LIVE_VALUES
    if live and schedule.overlap == Overlap.SKIP:
        if told:
            tell(schedule, ScheduleEvent.SKIPPED, due_at=due_at, reason="its last run is still live", now=now)
        return Fired(due_at, FireOutcome.SKIPPED)
    if live and schedule.overlap == Overlap.BUFFER_ONE:
        if schedule.buffered_due_at is None:
            schedule.buffered_due_at = due_at
            return Fired(due_at, FireOutcome.BUFFERED)
        if told:
            tell(schedule, ScheduleEvent.SKIPPED, due_at=due_at, reason="a due time is buffered already", now=now)
        return Fired(due_at, FireOutcome.SKIPPED)
    if live and schedule.overlap == Overlap.CANCEL_OTHER:
        assert last is not None
        _cancel_other(last, schedule=schedule, now=now)
    return create_run(schedule, due_at=due_at, now=now, told=told, guarded=guarded)


def _cancel_other(last: Run, *, schedule: Schedule, now: datetime) -> None:
    # The normal cancel, under the run's lock (taken after the schedule's, the one order: nothing
    # locks a schedule under a run's lock), which its end notifies to the worker running it.
    run = lock_run(last.id, ending=True)
    if run.status in LIVE_VALUES:
        note = f"schedule {schedule.id} fired again (overlap cancel_other)"
        end(run, Status.CANCELLED, code=CancelCode.SCHEDULE_OVERLAP, reason=note, by=SYSTEM, now=now)


def _spec(schedule: Schedule) -> RunSpec:
    return RunSpec(agent=schedule.agent, input=schedule.input, metadata=schedule.metadata, priority=schedule.priority)


def create_run(
    schedule: Schedule, *, due_at: datetime, now: datetime, told: bool = True, guarded: bool = False
) -> Fired:
    """The run of `due_at`, created as any run is (its checks, the owner's caps, its event and
    notifications); refused, the schedule tells `schedule.failed` and its due time still passes."""
    spec = _spec(schedule)
    try:
        # Every refusal comes before the insert writes anything: no savepoint is needed for them.
        spec.check()
        spec.check_owner(schedule.owner)
        if guarded:
            try:
                with transaction.atomic():
                    run = insert_run(spec, owner=schedule.owner, now=now, schedule=(schedule.id, due_at))
            except IntegrityError:
                return Fired(due_at, FireOutcome.EXISTS)
        else:
            run = insert_run(spec, owner=schedule.owner, now=now, schedule=(schedule.id, due_at))
    except RunledgerError as exc:
        if not told:
            raise
        tell(schedule, ScheduleEvent.FAILED, due_at=due_at, reason=exc.message, now=now)
        return Fired(due_at, FireOutcome.FAILED)
    schedule.last_run, schedule.told = run, ""
    return Fired(due_at, FireOutcome.CREATED, run)


def trigger_locked(schedule: Schedule, *, now: datetime) -> Run | None:
    """`schedule_trigger`'s fire, on the schedule its caller locked: due now, the overlap applies,
    the next due time stays. Nothing is told: the caller hears (None, or the refusal raised)."""
    # Its due time is now; in the rare case now is one of the schedule's own due times, a
    # microsecond later, so that the due time's fire still creates its run.
    due = now + _BEFORE if rule_of(schedule).next_after(now - _BEFORE) == now else now
    fired = overlap_fire(schedule, due_at=due, now=now, told=False)
    schedule.save(update_fields=["last_run", "buffered_due_at", "told"])
    series.schedule_fired(fired.outcome, lateness=0.0, missed=0)
    return fired.run


def backfill_locked(schedule: Schedule, *, start: datetime, end: datetime, limit: int, now: datetime) -> list[Run]:
    """`schedule_backfill`'s runs, on the schedule its caller locked: its due times from `start` to
    `end` without a run yet, oldest first, at most `limit`; a due time it covers that the schedule
    had still to fire moves its next due time past it."""
    rule = rule_of(schedule)
    taken = set(
        Run.objects.filter(schedule=schedule, schedule_due_at__gte=start, schedule_due_at__lte=end).values_list(
            "schedule_due_at", flat=True
        )
    )
    spec = _spec(schedule)
    spec.check()
    spec.check_owner(schedule.owner)
    runs: list[Run] = []
    due = rule.next_after(start - _BEFORE)
    while due <= end and len(runs) < limit:
        if due not in taken and (schedule.start_at is None or due >= schedule.start_at):
            runs.append(insert_run(spec, owner=schedule.owner, now=now, schedule=(schedule.id, due)))
        due = rule.next_after(due)
    if runs:
        schedule.last_run, schedule.told = runs[-1], ""
        latest = runs[-1].schedule_due_at
        assert latest is not None
        if schedule.next_due_at is not None and schedule.next_due_at <= latest:
            schedule.next_due_at = due_after(rule, latest, end_at=schedule.end_at)
        schedule.save(update_fields=["last_run", "next_due_at", "told"])
    return runs
