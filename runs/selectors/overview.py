"""Reads about the whole system rather than one run: the staff dashboard's figures
(docs/design/operations.md#dashboard), and the queue's age and cancel → released latencies that
/metrics/ reports as defined here. A fixed number of queries whatever the size of the tables, each
through an index that holds only what it counts, over a window of time, never the history."""

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from django.db import connection
from django.db.models import Count, F, Q
from django.db.models.functions import Now, TruncMinute

from runs.models import LIVE_VALUES, AttemptOutcome, Run, RunAttempt, RunEvent
from runs.transitions import TERMINAL, Status

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
MINUTES = 60
# Held attempts listed (a worker fleet's concurrency); more are counted as "and more".
HELD_SHOWN = 500
# Cancel latencies read for the day's distribution: the newest ones when there were more.
LATENCIES_READ = 20_000
# Minutes whose event counts no longer change, and those counts, per database (_events_per_minute).
SETTLED = timedelta(minutes=2)
_settled: dict[str, dict[datetime, int]] = {}
# The outcomes an attempt can have once its run was cancelled or stopped under it: the command's,
# until a sweeper releases it for a worker that never said it stopped, which makes it `lost`
# (`run_attempts_release_lapsed`). Stated positively, for the partial index that holds them
# (`runattempt_cancel_released`).
CANCEL_OUTCOMES = sorted(o.value for o in (AttemptOutcome.CANCELLED, AttemptOutcome.STOPPED, AttemptOutcome.LOST))
# The attempts a cancel or stop ended while they held their run: what "cancel → released" is
# measured on, here and by /metrics/ (runledger_cancel_release_seconds, observed at each release).
# The run ended cancelled or stopped, and this is its last attempt: either its outcome still says
# so, or it was lost after the run last entered the queue — an attempt lost to its lapsed lease
# sends the run back to the queue (a new `queued_at`) after its release, one lost after the run
# ended does not.
CANCELLED_UNDER = Q(
    Q(outcome__in=[AttemptOutcome.CANCELLED.value, AttemptOutcome.STOPPED.value])
    | Q(outcome=AttemptOutcome.LOST.value, released_at__gt=F("run__queued_at")),
    run__status__in=[Status.CANCELLED.value, Status.STOPPED.value],
    generation=F("run__generation"),
)


@dataclass(frozen=True)
class HeldRun:
    run_id: UUID
    agent: str
    status: str
    generation: int
    worker: str
    claimed_at: datetime
    heartbeat_at: datetime
    lease_expires_at: datetime


@dataclass(frozen=True)
class Worker:
    name: str
    held: list[HeldRun]
    last_heartbeat: datetime


@dataclass(frozen=True)
class Latencies:
    """Cancel or stop committed → attempt released, in seconds, oldest first."""

    seconds: list[float]
    capped: bool = False

    def percentile(self, p: float) -> float | None:
        """Nearest rank: the smallest latency that at least p % of them do not exceed."""
        if not self.seconds:
            return None
        ordered = sorted(self.seconds)
        return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


@dataclass(frozen=True)
class Overview:
    now: datetime
    live: dict[str, int]
    ended_last_hour: dict[str, int]
    ended_last_day: dict[str, int]
    # When the queued run that has waited longest entered the queue.
    queue_oldest: datetime | None
    workers: list[Worker]
    stale: list[HeldRun]
    held_more: bool
    # One per minute, oldest first; the last is the minute now in progress.
    minutes: list[datetime]
    events_per_minute: list[int]
    ended_per_minute: list[int]
    cancel_latency_hour: Latencies
    cancel_latency_day: Latencies

    @property
    def queue_depth(self) -> int:
        return self.live.get(Status.QUEUED.value, 0)


def status_counts(statuses: list[str]) -> dict[str, int]:
    """Runs in each of `statuses` (those with none left out). Live ones through the live-runs
    partial index; ended ones read every ended run."""
    rows = Run.objects.filter(status__in=statuses).order_by().values_list("status").annotate(n=Count("*"))
    return dict(rows.values_list("status", "n"))


def queue_oldest_entered() -> datetime | None:
    """When the queued run that has waited longest entered the queue — created, requeued or
    resumed: a run that went back to the queue has waited since then — through `run_queued_at`."""
    # A run scheduled ahead enters the queue at its start_after (`queued_at`): not waiting before.
    due = Run.objects.filter(status=Status.QUEUED, queued_at__lte=Now())
    return due.order_by("queued_at").values_list("queued_at", flat=True).first()


def leases_stale(*, now: datetime) -> int:
    """Held attempts whose lease lapsed before `now` and that no sweeper has requeued yet, through
    the open-lease partial index."""
    return RunAttempt.objects.filter(outcome=AttemptOutcome.RUNNING, lease_expires_at__lt=now).count()


def cancel_release_seconds(*, ended_at: datetime, released_at: datetime) -> float:
    """The latency of a release `CANCELLED_UNDER` counts. An attempt whose lease lapsed before the
    cancel (a sweeper released it as of the lapse) counts as released at the cancel; and the two
    times may come from two machines' clocks, whose skew could make it negative."""
    return max(0.0, (released_at - ended_at).total_seconds())


def _minute(when: datetime) -> datetime:
    return when.replace(second=0, microsecond=0)


def _per_minute(rows: dict[datetime, int], minutes: list[datetime]) -> list[int]:
    return [rows.get(minute, 0) for minute in minutes]


def _held(now: datetime) -> tuple[list[Worker], list[HeldRun], bool]:
    attempts = list(
        RunAttempt.objects.filter(outcome=AttemptOutcome.RUNNING)
        .order_by("worker", "claimed_at")
        .values_list(
            "run_id",
            "run__agent",
            "run__status",
            "generation",
            "worker",
            "claimed_at",
            "heartbeat_at",
            "lease_expires_at",
        )[: HELD_SHOWN + 1]
    )
    held = [HeldRun(*row) for row in attempts[:HELD_SHOWN]]
    by_worker: dict[str, list[HeldRun]] = defaultdict(list)
    stale: list[HeldRun] = []
    for attempt in held:
        # A lapsed lease is no longer held by anyone alive: the sweeper will requeue it.
        (stale if attempt.lease_expires_at < now else by_worker[attempt.worker]).append(attempt)
    workers = [Worker(name, runs, max(r.heartbeat_at for r in runs)) for name, runs in sorted(by_worker.items())]
    return workers, stale, len(attempts) > HELD_SHOWN


def _latencies(now: datetime) -> tuple[Latencies, Latencies]:
    """The last hour's and the last day's, from one read of the day's."""
    rows = list(
        RunAttempt.objects.filter(
            CANCELLED_UNDER, outcome__in=CANCEL_OUTCOMES, released_at__gte=now - DAY, released_at__lte=now
        )
        .order_by("-released_at")
        .values_list("released_at", "run__ended_at")[: LATENCIES_READ + 1]
    )
    capped = len(rows) > LATENCIES_READ
    timed = [
        (released, cancel_release_seconds(ended_at=ended, released_at=released))
        for released, ended in reversed(rows[:LATENCIES_READ])
        if released is not None and ended is not None
    ]
    hour = Latencies([seconds for released, seconds in timed if released >= now - HOUR], capped=capped)
    return hour, Latencies([seconds for _, seconds in timed], capped=capped)


def _events_per_minute(minutes: list[datetime], now: datetime) -> dict[datetime, int]:
    """Events by minute over `minutes`. A minute more than SETTLED old no longer changes (an
    event's time is its append's, committed within the second), so its count is kept by this
    process and only the settled minutes it lacks and the recent ones are counted: the first
    page of a process reads the hour's events, each refresh after it about two minutes' worth."""
    global _settled
    settled_before = _minute(now) - SETTLED
    key = connection.settings_dict["NAME"]
    known = {m: n for m, n in _settled.get(key, {}).items() if m >= minutes[0]}
    missing = [m for m in minutes if m < settled_before and m not in known]
    since = missing[0] if missing else settled_before
    counted = dict(
        RunEvent.objects.filter(created_at__gte=since, created_at__lte=now)
        .annotate(minute=TruncMinute("created_at"))
        .order_by()
        .values_list("minute")
        .annotate(n=Count("*"))
        .values_list("minute", "n")
    )
    known.update({m: counted.get(m, 0) for m in minutes if since <= m < settled_before})
    _settled = {key: known}
    return {**known, **{m: n for m, n in counted.items() if m >= settled_before}}


def system_overview(*, now: datetime) -> Overview:
    """The dashboard's figures at `now` (the database's clock), in 6 queries."""
    live = status_counts(LIVE_VALUES)
    queue_oldest = queue_oldest_entered()
    workers, stale, held_more = _held(now)

    first_minute = _minute(now) - timedelta(minutes=MINUTES - 1)
    minutes = [first_minute + timedelta(minutes=i) for i in range(MINUTES)]
    ended_rows = (
        Run.objects.filter(ended_at__gte=now - DAY, ended_at__lte=now)
        .annotate(minute=TruncMinute("ended_at"))
        .order_by()
        .values_list("status", "minute")
        .annotate(n=Count("*"))
    )
    ended_last_day: dict[str, int] = defaultdict(int)
    ended_last_hour: dict[str, int] = defaultdict(int)
    ended_by_minute: dict[datetime, int] = defaultdict(int)
    for status, minute, n in ended_rows:
        ended_last_day[status] += n
        # The hour is that of the 60 bars (from the start of the first minute): their sum.
        if minute >= first_minute:
            ended_by_minute[minute] += n
            ended_last_hour[status] += n
    events = _events_per_minute(minutes, now)
    hour, day = _latencies(now)
    return Overview(
        now=now,
        live={s: live.get(s, 0) for s in LIVE_VALUES},
        ended_last_hour={s.value: ended_last_hour.get(s.value, 0) for s in sorted(TERMINAL)},
        ended_last_day={s.value: ended_last_day.get(s.value, 0) for s in sorted(TERMINAL)},
        queue_oldest=queue_oldest,
        workers=workers,
        stale=stale,
        held_more=held_more,
        minutes=minutes,
        events_per_minute=_per_minute(events, minutes),
        ended_per_minute=_per_minute(ended_by_minute, minutes),
        cancel_latency_hour=hour,
        cancel_latency_day=day,
    )
