"""Workers that die, stall, lose the database or shut down, and the runs they held.

Real worker subprocesses on the test database, with short leases (tests.support.procs.FAST_INTERVALS);
every wait is for a database condition or a log line, with a deadline.
"""

import signal
import subprocess
import sys
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from pytest_django import Settings

from runs.agents.demo import demo_text
from runs.conf import check_settings
from runs.models import AttemptOutcome, Run, RunAttempt, RunEvent
from runs.worker import Worker
from tests.factories import queued_run
from tests.support.checks import assert_nothing_after_terminal
from tests.support.db import token_for
from tests.support.procs import ROOT, Proc, Procs, database_url, subprocess_env, wait_log_line
from tests.support.proxies import PartitionableProxy
from tests.support.runs import attempt, delta_count, deltas_of, event_types, fresh, released, stored_text
from tests.support.waiting import wait_until
from tests.support.workers import prove_worker_moved_on, wait_status, wait_streaming

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

# Streams for about 7 s: long enough to take from a worker mid-run even when starting the second
# worker is slow (a loaded machine), and for another to finish.
LONG: dict[str, Any] = {"deltas": 300, "delay_ms": 25}


def streaming_beside_w2(procs: Procs, alice: User, streamed: int, **fields: Any) -> tuple[Proc, Run]:
    """Worker w1 (returned) streaming a LONG run of `alice`'s, `streamed` deltas in, and w2 started
    beside it: it cannot claim the run while w1 holds it, but it sweeps."""
    first = procs.worker("w1")
    run = queued_run(alice, input=LONG, **fields)
    wait_streaming(run, streamed)
    procs.worker("w2")
    return first, run


def assert_taken_over(run: Run, *, lost: int, cause: str) -> None:
    """The run was requeued after attempt `lost` (with `cause`) and nothing that attempt wrote
    landed after that; the stored text is one uninterrupted run's, every chunk once."""
    run = fresh(run)
    requeued = RunEvent.objects.get(run_id=run.pk, type="run.requeued", data__generation=lost)
    assert requeued.data == {"generation": lost, "cause": cause} and requeued.attempt is None
    assert not RunEvent.objects.filter(run_id=run.pk, attempt=lost, seq__gt=requeued.seq).exists()
    assert RunEvent.objects.filter(run_id=run.pk, attempt=lost + 1, seq__lt=requeued.seq).count() == 0
    deltas = run.input["deltas"]
    assert stored_text(run) == demo_text(deltas) and delta_count(run) == deltas
    assert run.output["text"] == demo_text(deltas)
    assert_nothing_after_terminal(run)


# --- a worker killed -----------------------------------------------------------------------------


@pytest.mark.sqlite
def test_a_killed_workers_run_is_taken_over_under_the_next_generation(procs: Procs, alice: User) -> None:
    first_worker, run = streaming_beside_w2(procs, alice, 10)

    first_worker.kill()

    run = wait_status(run, "completed", timeout=30)
    assert (run.generation, run.lost_attempts) == (2, 1)
    first, second = attempt(run, 1), attempt(run, 2)
    assert first is not None and second is not None
    # Its worker died: the attempt is lost, released as of its lease's lapse (self-fencing).
    assert (first.worker, first.outcome, first.released_at) == ("w1", AttemptOutcome.LOST, first.lease_expires_at)
    assert (second.worker, second.outcome) == ("w2", AttemptOutcome.COMPLETED)
    assert first.lease_expires_at <= second.claimed_at
    assert deltas_of(run, 1) >= 10 and deltas_of(run, 2) == LONG["deltas"] - deltas_of(run, 1)
    assert_taken_over(run, lost=1, cause="lease_expired")


@pytest.mark.sqlite
def test_a_run_whose_lost_attempts_reach_max_attempts_fails_worker_lost(procs: Procs, alice: User) -> None:
    first_worker, run = streaming_beside_w2(procs, alice, 3, max_attempts=1)

    first_worker.kill()

    run = wait_status(run, "failed", timeout=30)
    assert (run.end_code, run.ended_by, run.lost_attempts, run.generation) == ("worker_lost", "system", 1, 1)
    assert run.end_reason == "1 of 1 attempts lost their worker"
    only = attempt(run)
    assert only is not None and only.outcome == AttemptOutcome.LOST
    assert not RunAttempt.objects.filter(run_id=run.pk, generation=2).exists()
    assert "run.requeued" not in event_types(run)
    assert_nothing_after_terminal(run)


def test_a_cancelled_runs_dead_worker_is_released_as_of_its_lease_and_the_api_says_so(
    procs: Procs, alice: User
) -> None:
    doomed = procs.worker("w1")
    run = queued_run(alice, input=LONG)
    wait_streaming(run, 3)
    doomed.kill()
    web = procs.uvicorn()
    api = httpx.Client(base_url=web.url, headers={"Authorization": f"Token {token_for(alice)}"}, timeout=10)

    cancelled = api.post(f"/api/runs/{run.pk}/cancel/", json={}).json()
    lease = cancelled["attempt"]["lease_expires_at"]
    assert cancelled["attempt"]["released_at"] is None and lease is not None
    procs.worker("w2")  # its sweeper finds the lapsed lease

    body = wait_until(lambda: (b := api.get(f"/api/runs/{run.pk}/").json())["attempt"]["released_at"] and b)
    assert body["attempt"]["released_at"] == lease and body["attempt"]["outcome"] == "lost"
    assert body["status"] == "cancelled" and body["lost_attempts"] == 0


# --- interval settings that work together, or are refused ---------------------------------------

# (lease, heartbeat, cancel grace) in seconds, as an operator would set them in the environment.
SETTINGS_THAT_WORK = [("2", "0.5", "0.5"), ("2", "0.4", "0.2"), ("3", "1", "0.25")]
SETTINGS_REFUSED = [
    (("1", "0.5", "0.5"), "the lease must be longer than 1.625 s"),
    (("2", "1.5", "0.1"), "the lease must be longer than 2.075 s"),
    (("0", "0.5", "0.2"), "RUNLEDGER_LEASE_SECONDS must be a number of seconds above 0, not '0'"),
    (("2", "-1", "0.2"), "RUNLEDGER_HEARTBEAT_SECONDS must be a number of seconds above 0, not '-1'"),
    (("2", "0.5", "soon"), "RUNLEDGER_CANCEL_GRACE_SECONDS must be a number of seconds ≥ 0 (0 = at once), not 'soon'"),
]


def _intervals(lease: str, heartbeat: str, grace: str) -> dict[str, str]:
    return subprocess_env(
        RUNLEDGER_LEASE_SECONDS=lease, RUNLEDGER_HEARTBEAT_SECONDS=heartbeat, RUNLEDGER_CANCEL_GRACE_SECONDS=grace
    )


@pytest.mark.parametrize("intervals", SETTINGS_THAT_WORK, ids="lease {0[0]}s heartbeat {0[1]}s grace {0[2]}s".format)
def test_a_killed_workers_run_completes_on_another_worker_with_settings_that_work(
    procs: Procs, alice: User, intervals: tuple[str, str, str]
) -> None:
    lease = float(intervals[0])
    env = _intervals(*intervals)
    first = procs.worker("w1", env=env)
    # Streams for twice the lease before its worker dies, then some more.
    streamed = int(2 * lease / 0.025)
    run = queued_run(alice, input={"deltas": streamed + 120, "delay_ms": 25})
    wait_until(lambda: deltas_of(run, 1) >= streamed, timeout=30, what="two leases' worth of streaming")
    # Its attempt renewed its lease all along instead of fencing itself.
    assert (fresh(run).generation, fresh(run).lost_attempts) == (1, 0)
    assert "could not renew its lease" not in first.log()
    first.kill()
    procs.worker("w2", env=env)

    run = wait_status(run, "completed", timeout=30)
    assert (run.generation, run.lost_attempts) == (2, 1)
    assert_taken_over(run, lost=1, cause="lease_expired")


@pytest.mark.parametrize(("intervals", "message"), SETTINGS_REFUSED, ids=[" ".join(i) for i, _ in SETTINGS_REFUSED])
def test_settings_that_cannot_work_are_refused_at_start_with_a_message_naming_them(
    intervals: tuple[str, str, str], message: str
) -> None:
    worker = subprocess.run(
        [sys.executable, "manage.py", "runworker", "--skip-checks"],
        cwd=ROOT,
        env=_intervals(*intervals),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert worker.returncode != 0
    assert message in worker.stderr, worker.stderr
    assert "RUNLEDGER_" in worker.stderr.splitlines()[-1]


# --- a worker stalled, or cut off from the database --------------------------------------------


def test_a_stalled_worker_stops_its_attempt_itself_and_its_late_writes_are_dropped(procs: Procs, alice: User) -> None:
    stalled, run = streaming_beside_w2(procs, alice, 5)

    stalled.signal(signal.SIGSTOP)  # as a long GC pause or a frozen VM: no renewal, no write
    try:
        wait_until(lambda: deltas_of(run, 2) >= 3, timeout=30, what="the next attempt streaming")
    finally:
        stalled.signal(signal.SIGCONT)

    # Back, it finds its lease lapsed and stops before writing anything more; the next attempt
    # goes on undisturbed.
    first = wait_until(lambda: released(run, 1), what="the stalled attempt's release")
    # Woken, it stops the attempt by whichever it notices first: its own lease deadline, or the
    # run having moved on to the next attempt.
    wait_log_line(stalled, "stopping:")
    assert first.outcome == AttemptOutcome.LOST and first.worker == "w1"
    run = wait_status(run, "completed", timeout=30)
    assert (run.generation, run.lost_attempts) == (2, 1)
    assert_taken_over(run, lost=1, cause="lease_expired")


def _through(proxy: PartitionableProxy) -> str:
    return database_url().replace(f":{connection.settings_dict['PORT']}/", f":{proxy.port}/")


def test_a_worker_cut_off_from_the_database_stops_its_attempt_before_the_lease_lapses(
    procs: Procs, alice: User
) -> None:
    proxy = PartitionableProxy(int(connection.settings_dict["PORT"])).start()
    try:
        cut_off = procs.worker("w1", env=subprocess_env(DATABASE_URL=_through(proxy)))
        run = queued_run(alice, input=LONG)
        wait_streaming(run, 5)
        other = procs.worker("w2")

        proxy.partition()  # w1's queries now hang; everyone else reaches the database
        wait_log_line(cut_off, "could not renew its lease in time", timeout=10)
        wait_until(lambda: deltas_of(run, 2) >= 3, timeout=30, what="the next attempt streaming")
        proxy.heal()

        # Once it reaches the database again, w1 records when it stopped: before its lease
        # lapsed, so before anyone could requeue the run — never two attempts at once.
        first = wait_until(lambda: released(run, 1), what="the cut-off attempt's release")
        second = attempt(run, 2)
        assert second is not None and second.worker == "w2"
        assert first.released_at is not None
        assert first.released_at <= first.lease_expires_at <= second.claimed_at
        run = wait_status(run, "completed", timeout=30)
        assert_taken_over(run, lost=1, cause="lease_expired")

        # w1 reconnected by itself: with w2 gone, it executes the next run.
        assert other.stop() == 0
        prove_worker_moved_on(alice, "w1")
    finally:
        proxy.stop()


def test_an_append_whose_commit_answer_was_lost_is_stored_once(procs: Procs, alice: User) -> None:
    proxy = PartitionableProxy(int(connection.settings_dict["PORT"])).start()
    try:
        worker = procs.worker("w1", env=subprocess_env(DATABASE_URL=_through(proxy)))
        run = queued_run(alice, input={"deltas": 80, "delay_ms": 20})
        wait_streaming(run, 5)

        # The next transaction the worker commits (an append of its chunks, or a step count) is
        # stored, but the worker only sees its connection fail, and sends it again.
        proxy.drop_next_commit_answer()
        wait_until(lambda: proxy.dropped_commit_answers == 1, what="a lost COMMIT answer")

        run = wait_status(run, "completed", timeout=20)
        assert "database unavailable" in worker.log()  # it did retry
        # Every chunk once: the retry found its events already stored and stored nothing again.
        assert stored_text(run) == demo_text(80) and delta_count(run) == 80
        assert run.steps_used == 2
        assert (run.generation, run.lost_attempts) == (1, 0)
        assert_nothing_after_terminal(run)
    finally:
        proxy.stop()


# --- shutting down ---------------------------------------------------------------------------------


@pytest.mark.sqlite
def test_sigterm_requeues_without_losing_a_retry_and_another_worker_completes(procs: Procs, alice: User) -> None:
    leaving, run = streaming_beside_w2(procs, alice, 10, max_attempts=1)

    assert leaving.stop(timeout=15) == 0

    run = wait_status(run, "completed", timeout=30)
    # A clean shutdown is no lost attempt: with max_attempts 1 the run could not afford one.
    assert (run.generation, run.lost_attempts) == (2, 0)
    first, second = attempt(run, 1), attempt(run, 2)
    assert first is not None and second is not None
    assert first.outcome == AttemptOutcome.SHUTDOWN and first.released_at is not None
    assert first.released_at <= second.claimed_at and second.worker == "w2"
    assert_taken_over(run, lost=1, cause="worker_shutdown")


def test_a_second_sigterm_exits_at_once_and_the_run_comes_back_by_lease_expiry(procs: Procs, alice: User) -> None:
    # A long grace: only the second signal can end this worker while its run sits in a tool call.
    leaving = procs.worker("w1", env=subprocess_env(RUNLEDGER_SHUTDOWN_GRACE_SECONDS="60"))
    # Long enough that the tool is still going when both signals have come, on a loaded machine too.
    run = queued_run(alice, input={"deltas": 6, "delay_ms": 1, "tool": "slow", "tool_ms": 5000})
    wait_until(lambda: "tool.started" in event_types(run), what="the tool call")
    procs.worker("w2")

    leaving.signal(signal.SIGTERM)
    wait_log_line(leaving, "finishing at safe boundaries")
    leaving.signal(signal.SIGTERM)
    assert leaving.popen.wait(timeout=10) == 1
    leaving.stopped = True

    run = wait_status(run, "completed", timeout=30)
    assert (run.generation, run.lost_attempts) == (2, 1)  # counted: it came back through its lease
    first = attempt(run, 1)
    assert first is not None and first.outcome == AttemptOutcome.LOST
    assert event_types(run).count("tool.started") == 1  # the next attempt finished the stored call
    assert_taken_over(run, lost=1, cause="lease_expired")


def test_no_run_stays_running_when_every_worker_dies(procs: Procs, alice: User) -> None:
    workers: list[Proc] = [procs.worker(f"w{i}", concurrency=2) for i in range(2)]
    runs = [queued_run(alice, input=LONG) for _ in range(4)]
    for run in runs:
        wait_streaming(run, 2)
    for worker in workers:
        worker.kill()

    # A worker started later sweeps what the dead ones held, and finishes it.
    procs.worker("w9", concurrency=4)
    for run in runs:
        run = wait_status(run, "completed", timeout=30)
        assert (run.generation, run.lost_attempts) == (2, 1)
        assert_taken_over(run, lost=1, cause="lease_expired")


@pytest.mark.sqlite
@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("RUNLEDGER_POLL_SECONDS", 0, "RUNLEDGER_POLL_SECONDS must be a number of seconds above 0, not 0"),
        ("RUNLEDGER_SWEEP_SECONDS", "5", "RUNLEDGER_SWEEP_SECONDS must be a number of seconds above 0, not '5'"),
        ("RUNLEDGER_SHUTDOWN_GRACE_SECONDS", -1, "RUNLEDGER_SHUTDOWN_GRACE_SECONDS must be a number of seconds ≥ 0"),
        ("RUNLEDGER_LEASE_SECONDS", 1, "the lease must be longer than"),
    ],
)
def test_the_system_check_and_the_worker_refuse_intervals_set_in_code(
    settings: Settings, name: str, value: Any, message: str
) -> None:
    settings.RUNLEDGER_HEARTBEAT_SECONDS, settings.RUNLEDGER_CANCEL_GRACE_SECONDS = 0.5, 0.5
    assert check_settings() == []
    setattr(settings, name, value)
    assert [(e.id, message in e.msg) for e in check_settings()] == [("runs.E002", True)]
    with pytest.raises(ImproperlyConfigured, match=message):
        Worker(once=True)
