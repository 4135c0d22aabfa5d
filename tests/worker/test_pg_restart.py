"""Workers across a PostgreSQL restart longer than a lease (marker `pg_cluster`: the suite's own
cluster only, see the `pg_cluster` fixture).

While the server is down every worker stops the attempts it holds by itself (it cannot renew
their leases) and records when it stopped once the server is back; its database threads and its
LISTEN connection reconnect by themselves; the sweepers requeue the lapsed runs and the workers
finish them. No run is executed by two attempts at once, and the stored text of each run is
exactly what one uninterrupted run produces.
"""

import time
from collections import defaultdict
from datetime import datetime
from typing import Any
from uuid import UUID

import pytest
from django.contrib.auth.models import User

from runs.agents.demo import demo_text
from runs.models import AttemptOutcome, Run, RunAttempt, RunEvent
from runs.transitions import TERMINAL
from tests.factories import queued_run
from tests.support.checks import assert_attempts_never_overlap
from tests.support.db import listening_pids
from tests.support.pg import PgCluster
from tests.support.procs import Procs, subprocess_env
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes, pytest.mark.pg_cluster]

RUNS = 200
WORKERS = 3
CONCURRENCY = 8
LEASE = 3.0
DELTAS = 10
RUN_INPUT: dict[str, Any] = {"deltas": DELTAS, "delay_ms": 100}  # about a second per run


def test_workers_survive_a_postgresql_restart_and_never_execute_a_run_twice_at_once(
    procs: Procs, alice: User, pg_cluster: PgCluster
) -> None:
    env = subprocess_env(RUNLEDGER_LEASE_SECONDS=str(LEASE), RUNLEDGER_HEARTBEAT_SECONDS="0.5")
    workers = [procs.worker(f"w{i}", concurrency=CONCURRENCY, env=env) for i in range(WORKERS)]
    runs = [queued_run(alice, input=RUN_INPUT) for _ in range(RUNS)]
    ids = [r.pk for r in runs]

    def completed() -> int:
        return Run.objects.filter(pk__in=ids, status="completed").count()

    # Restart mid-way: some runs done, many executing.
    wait_until(
        lambda: completed() >= RUNS // 4 and Run.objects.filter(pk__in=ids, status="running").count() >= 10,
        timeout=30,
        what="a quarter of the runs done and runs executing",
    )
    pg_cluster.stop()
    down_since = time.monotonic()
    # The outage is the scenario, not a wait for something: 1.5 leases, so every lease held when
    # the server went down lapses while it is down. Meanwhile the workers must stay up.
    while time.monotonic() - down_since < 1.5 * LEASE:
        for worker in workers:
            assert worker.popen.poll() is None, worker.log()
        time.sleep(0.1)  # the outage's own clock; nothing to synchronise with while the server is down
    pg_cluster.start()
    restarted_at = time.time()

    wait_until(lambda: completed() == RUNS, timeout=60, what=f"all {RUNS} runs completing")
    # Each worker's LISTEN connection is back on the new server.
    wait_until(
        lambda: set(listening_pids()) >= {w.pid for w in workers}, timeout=10, what="every worker listening again"
    )

    for worker in workers:
        assert worker.popen.poll() is None, worker.log()
    logs = "".join(worker.log() for worker in workers)
    assert "could not renew its lease in time" in logs  # attempts stopped themselves while it was down
    assert "listener lost its connection" in logs

    events_by_run: dict[UUID, list[RunEvent]] = defaultdict(list)
    for event in RunEvent.objects.filter(run_id__in=ids).order_by("run_id", "seq"):
        events_by_run[event.run_id].append(event)
    attempts_by_run: dict[UUID, list[RunAttempt]] = defaultdict(list)
    for attempt in RunAttempt.objects.filter(run_id__in=ids):
        attempts_by_run[attempt.run_id].append(attempt)

    requeued_runs = 0
    for run in Run.objects.filter(pk__in=ids):
        events = events_by_run[run.pk]
        assert [e.seq for e in events] == list(range(1, run.last_seq + 1))
        assert [e.type for e in events if e.type.removeprefix("run.") in TERMINAL] == ["run.completed"]
        assert events[-1].type == "run.completed"
        # Every chunk exactly once, in order: nothing duplicated by a retried append, nothing lost.
        assert "".join(e.data["text"] for e in events if e.type == "output.delta") == demo_text(DELTAS)
        # Nothing an attempt wrote landed after that attempt was requeued.
        for requeued in (e for e in events if e.type == "run.requeued"):
            generation = requeued.data["generation"]
            assert requeued.data["cause"] == "lease_expired"
            assert all(e.seq < requeued.seq for e in events if e.attempt == generation), run.pk
        attempts = attempts_by_run[run.pk]
        assert len(attempts) == run.generation
        assert run.lost_attempts == sum(a.outcome == AttemptOutcome.LOST for a in attempts)
        assert_attempts_never_overlap(attempts)
        requeued_runs += run.lost_attempts > 0

    # The restart really took runs from under their workers, and the workers took them back.
    assert requeued_runs > 0
    reclaimed = RunAttempt.objects.filter(run_id__in=ids, generation__gt=1).values_list("worker", flat=True)
    assert reclaimed.exists()
    after_restart = RunAttempt.objects.filter(
        run_id__in=ids, claimed_at__gt=datetime.fromtimestamp(restarted_at).astimezone()
    )
    assert set(after_restart.values_list("worker", flat=True)) == {f"w{i}" for i in range(WORKERS)}
    print(
        f"{RUNS} runs, {WORKERS} workers x {CONCURRENCY}, 1 restart of {1.5 * LEASE:.1f}s: "
        f"{requeued_runs} runs requeued after losing their lease, "
        f"{sum(len(a) for a in attempts_by_run.values())} attempts"
    )
