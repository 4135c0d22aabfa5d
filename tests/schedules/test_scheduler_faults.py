"""Exactly once across workers and faults (docs/design/schedules.md#firing): three worker processes
race to fire a schedule due every second for 30 s while workers are SIGKILLed and PostgreSQL is
restarted under them (marker `pg_cluster`: the suite's own cluster only) — one run per due time,
counted by due time, and each on time while a worker and the database are up."""

import time
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from runs.models import Run, Schedule
from runs.services.schedules import schedule_create
from tests.support.pg import PgCluster
from tests.support.procs import Proc, Procs, subprocess_env
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes, pytest.mark.pg_cluster]

SECOND = timedelta(seconds=1)
DUE_TIMES = 30
OUTAGE_SECONDS = 3.0


@pytest.fixture(autouse=True)
def _short_schedules(settings: Any) -> None:
    settings.RUNLEDGER_MIN_SCHEDULE_SECONDS = 1


def test_three_workers_fire_each_due_time_once_through_kills_and_a_postgresql_restart(
    procs: Procs, alice: User, pg_cluster: PgCluster
) -> None:
    env = subprocess_env(RUNLEDGER_SCHEDULER_POLL_SECONDS="0.5")
    workers: list[Proc] = [procs.worker(f"w{i}", concurrency=4, env=env) for i in range(3)]
    start = timezone.now() + SECOND
    # Every due time has its run, each beside the others (allow_all), the outage's caught up (the window).
    schedule = schedule_create(
        owner=alice,
        agent="demo",
        input={"deltas": 1, "delay_ms": 0},
        every_seconds=1,
        start_at=start,
        end_at=start + (DUE_TIMES - 1) * SECOND,
        overlap="allow_all",
        catchup_window_seconds=DUE_TIMES,
    )

    def at(offset: float) -> None:
        wait_until(lambda: timezone.now() >= start + offset * SECOND, timeout=DUE_TIMES + 30, what=f"{offset} s in")

    # A worker dies mid-stream, without unwinding; another takes its place.
    at(6.3)
    workers[0].kill()
    workers.append(procs.worker("w3", concurrency=4, env=env))
    # PostgreSQL goes away for a few due times and comes back.
    at(12.5)
    pg_cluster.stop()
    outage_from = timezone.now()
    down_since = time.monotonic()
    while time.monotonic() - down_since < OUTAGE_SECONDS:
        for worker in workers[1:]:
            assert worker.popen.poll() is None, worker.log()
        time.sleep(0.1)  # the outage's own clock; nothing to synchronise with while the server is down
    pg_cluster.start()
    outage_to = timezone.now()
    # Two of them die at once, right after a due time.
    at(21.05)
    workers[1].kill()
    workers[2].kill()
    workers.append(procs.worker("w4", concurrency=4, env=env))

    wait_until(
        lambda: Schedule.objects.get(pk=schedule.pk).next_due_at is None,
        timeout=DUE_TIMES + 30,
        what="the schedule's last due time fired",
    )
    fired = list(Run.objects.filter(schedule=schedule).values_list("schedule_due_at", "created_at"))
    per_due = Counter(due for due, _ in fired)
    assert sorted(per_due) == [start + k * SECOND for k in range(DUE_TIMES)]
    assert set(per_due.values()) == {1}, [due for due, n in per_due.items() if n > 1]

    # Lateness while a worker and the database were up (the outage's due times were caught up after
    # it, and a second more for the workers' connections to come back).
    up = [
        (created - due).total_seconds()
        for due, created in fired
        if not outage_from - SECOND <= due <= outage_to + 2 * SECOND
    ]
    up.sort()
    assert len(up) >= DUE_TIMES - 8
    assert up[min(len(up) - 1, int(len(up) * 0.99))] <= 1.0, up
    for worker in workers[3:]:
        assert worker.popen.poll() is None, worker.log()
    assert "could not fire schedules" in "".join(worker.log() for worker in workers[1:])
