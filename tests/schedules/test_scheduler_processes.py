"""The workers' scheduler in real worker processes (docs/design/schedules.md#scheduler): every overlap
policy with runs longer than the interval, catch-up after the workers were down for ten intervals,
and the firing lateness while a worker is up. Three workers racing, killed and across a PostgreSQL
restart: tests/schedules/test_scheduler_faults.py."""

import itertools
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from runs.models import Run, RunEvent, Schedule
from runs.services.schedules import schedule_create, schedule_pause
from tests.support.procs import Procs, subprocess_env
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes, pytest.mark.sqlite]

SECOND = timedelta(seconds=1)
# A run of the demo agent takes about 2.5 s: longer than the schedules' interval.
LONG_RUN: dict[str, Any] = {"deltas": 10, "delay_ms": 250}


@pytest.fixture(autouse=True)
def _short_schedules(settings: Any) -> None:
    settings.RUNLEDGER_MIN_SCHEDULE_SECONDS = 1


def scheduler_env(**extra: str) -> dict[str, str]:
    return subprocess_env(RUNLEDGER_SCHEDULER_POLL_SECONDS="0.5", RUNLEDGER_MIN_SCHEDULE_SECONDS="1", **extra)


def every_second(owner: User, *, start_at: datetime, **given: Any) -> Schedule:
    return schedule_create(owner=owner, agent="demo", input=LONG_RUN, every_seconds=1, start_at=start_at, **given)


def runs_of(schedule: Schedule) -> list[Run]:
    return list(Run.objects.filter(schedule=schedule).order_by("schedule_due_at"))


def lateness(runs: list[Run]) -> list[float]:
    return [(run.created_at - run.schedule_due_at).total_seconds() for run in runs]  # type: ignore[operator]


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def test_each_overlap_policy_with_runs_longer_than_the_interval(procs: Procs, alice: User) -> None:
    # Room for every run at once (allow_all's three, cancel_other's two, and a slot kept for newcomers).
    procs.worker("w0", concurrency=12, env=scheduler_env())
    start = timezone.now() + SECOND
    policies = ["skip", "buffer_one", "allow_all", "cancel_other"]
    schedules = {policy: every_second(alice, start_at=start, overlap=policy) for policy in policies}
    # Seven due times, each handled by the scheduler (fired, skipped or buffered) before the pause:
    # each policy meets a live run several times.
    last = start + 6 * SECOND
    wait_until(
        lambda: Schedule.objects.filter(pk__in=[s.pk for s in schedules.values()], next_due_at__gt=last).count() == 4,
        timeout=20,
        what="seven due times handled",
    )
    for schedule in schedules.values():
        schedule_pause(schedule_id=schedule.pk, actor=alice)
    wait_until(
        lambda: (
            Run.objects.filter(schedule__in=schedules.values(), status__in=["queued", "running"]).count() == 0
            and Schedule.objects.filter(buffered_due_at__isnull=False).count() == 0
        ),
        timeout=30,
        what="every schedule's runs ended",
    )

    # allow_all: one run per due time, running beside each other.
    allowed = runs_of(schedules["allow_all"])
    assert [run.schedule_due_at for run in allowed] == [start + k * SECOND for k in range(7)]
    assert all(later.started_at < earlier.ended_at for earlier, later in itertools.pairwise(allowed))  # type: ignore[operator]
    assert {run.status for run in allowed} == {"completed"}

    # skip: a run at a time; the due times met by a live one made nothing.
    skipped = runs_of(schedules["skip"])
    assert 2 <= len(skipped) < 7 and skipped[0].schedule_due_at == start
    assert all(earlier.ended_at <= later.created_at for earlier, later in itertools.pairwise(skipped))  # type: ignore[operator]

    # buffer_one: a run at a time too, each buffered one created as the live one ended, late.
    # On PostgreSQL the end's notification wakes the scheduler; SQLite has none, so its next poll
    # (0.5 s here) makes it, behind the file's one writer: the four schedules' live runs appending.
    promptly = 1 if connection.vendor == "postgresql" else 5
    buffered = runs_of(schedules["buffer_one"])
    assert len(buffered) >= 2
    for earlier, later in itertools.pairwise(buffered):
        assert earlier.ended_at <= later.created_at  # type: ignore[operator]
        assert (later.created_at - earlier.ended_at).total_seconds() < promptly  # type: ignore[operator]
        assert later.created_at - later.schedule_due_at > SECOND  # type: ignore[operator]
    assert {run.status for run in buffered} == {"completed"}

    # cancel_other: each due time's run cancelled the one before, through the normal cancel.
    cancelling = runs_of(schedules["cancel_other"])
    assert [run.schedule_due_at for run in cancelling] == [start + k * SECOND for k in range(7)]
    assert all((run.status, run.end_code) == ("cancelled", "schedule_overlap") for run in cancelling[:-1])
    assert cancelling[-1].status == "completed" and cancelling[-1].schedule_due_at == last
    cancelled = RunEvent.objects.filter(run__in=cancelling[:-1], type="run.cancelled")
    assert cancelled.count() == 6

    # While the worker was up, every due time fired within a second.
    fired_on_time = allowed + cancelling + skipped[:1]
    assert p99(lateness(fired_on_time)) <= 1.0, lateness(fired_on_time)


def test_catch_up_after_the_workers_were_down_for_ten_intervals(procs: Procs, alice: User) -> None:
    start = timezone.now() + SECOND
    quick = {"deltas": 1, "delay_ms": 0}
    default = schedule_create(owner=alice, agent="demo", input=quick, every_seconds=1, start_at=start)
    windowed = schedule_create(
        owner=alice,
        agent="demo",
        input=quick,
        every_seconds=1,
        start_at=start,
        overlap="allow_all",
        catchup_window_seconds=5,
    )
    # No worker is up: ten due times pass unfired (the outage is the scenario, not a wait for one).
    wait_until(lambda: timezone.now() > start + 10 * SECOND, timeout=20, what="ten due times passing")
    procs.worker("w0", concurrency=4, env=scheduler_env())
    # The catch-up, then two due times on time.
    wait_until(lambda: len(runs_of(windowed)) >= 7, timeout=20, what="the catch-up and two more fires")
    for schedule in (default, windowed):
        schedule_pause(schedule_id=schedule.pk, actor=alice)

    for schedule, caught_up in ((default, 1), (windowed, 5)):
        runs = runs_of(schedule)
        first_fire = min(run.created_at for run in runs)
        assert first_fire > start + 10 * SECOND
        # The catch-up: the runs of due times already past at the worker's first fire.
        burst = [run for run in runs if run.schedule_due_at <= first_fire]  # type: ignore[operator]
        assert len(burst) == caught_up, [(r.schedule_due_at, r.created_at) for r in runs]
        assert all(run.created_at - first_fire < 0.5 * SECOND for run in burst)
        dues = [run.schedule_due_at for run in burst]
        assert dues == [dues[0] + k * SECOND for k in range(caught_up)]  # consecutive: the latest ones
        assert first_fire - dues[-1] < SECOND  # up to the latest missed one
        # Fired in order, oldest first.
        assert [run.created_at for run in burst] == sorted(run.created_at for run in burst)
        # None older: no herd of the other missed due times.
        assert not Run.objects.filter(schedule=schedule, schedule_due_at__lt=dues[0]).exists()
