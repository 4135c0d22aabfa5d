"""Worker processes (`manage.py runworker`) executing runs, and commands that reach them.

Every test starts real worker subprocesses on the test database and waits for database
conditions with a deadline; nothing sleeps to synchronise.
"""

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection

from runs import services
from runs.agents.demo import demo_text
from runs.exceptions import StaleTicket
from runs.models import AttemptOutcome, Run, RunAttempt, RunEvent
from tests.factories import assert_log_is_sound, queued_run
from tests.support.checks import assert_nothing_after_terminal, assert_tool_call_sealed
from tests.support.db import listener_backends as _listener_backends
from tests.support.procs import Proc, Procs, subprocess_env, wait_log_line
from tests.support.runs import attempt, delta_count, event_types, fresh, released, stored_text
from tests.support.waiting import wait_until
from tests.support.workers import prove_worker_moved_on, wait_status, wait_streaming

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

# A run that streams for ~10 s unless something stops it: long enough to act on mid-stream.
STREAMING: dict[str, Any] = {"deltas": 500, "delay_ms": 20}


def asking(procs: Procs, alice: User, question: str, deltas: int, delay_ms: int) -> Run:
    """A demo run of `alice`'s that a worker has taken to its `question`, half its deltas in: waiting."""
    procs.worker("w1")
    run = queued_run(alice, input={"deltas": deltas, "delay_ms": delay_ms, "ask": question})
    return wait_status(run, "waiting")


# --- running ------------------------------------------------------------------------------------


@pytest.mark.sqlite
def test_a_worker_runs_a_queued_run_to_completion(procs: Procs, alice: User) -> None:
    procs.worker("w1")
    run = queued_run(alice, input={"deltas": 6, "delay_ms": 1})
    run = wait_status(run, "completed")
    assert stored_text(run) == demo_text(6)
    assert run.output["text"] == demo_text(6)
    found = attempt(run)
    assert found is not None and found.worker == "w1"
    assert found.outcome == AttemptOutcome.COMPLETED and found.released_at is not None
    assert_nothing_after_terminal(run)


@pytest.mark.sqlite
def test_a_worker_with_max_runs_exits_after_that_many(procs: Procs, alice: User) -> None:
    runs = [queued_run(alice, input={"deltas": 1, "delay_ms": 0}) for _ in range(3)]
    worker = procs.worker("w1", args=["--max-runs", "2"])
    assert worker.popen.wait(timeout=20) == 0
    statuses = sorted(fresh(r).status for r in runs)
    assert statuses == ["completed", "completed", "queued"]


def test_several_workers_claim_each_run_once(procs: Procs, alice: User) -> None:
    for i in range(3):
        procs.worker(f"w{i}", concurrency=2)
    runs = [queued_run(alice, input={"deltas": 3, "delay_ms": 5}) for _ in range(24)]
    for run in runs:
        wait_status(run, "completed")
    for run in runs:
        assert list(RunAttempt.objects.filter(run_id=run.pk).values_list("generation", flat=True)) == [1]
        assert stored_text(run) == demo_text(3)
        assert_nothing_after_terminal(run)
    workers = set(RunAttempt.objects.filter(run__in=runs).values_list("worker", flat=True))
    assert workers <= {"w0", "w1", "w2"}


# --- cancellation -------------------------------------------------------------------------------


@pytest.mark.sqlite
def test_cancelling_a_streaming_run_stops_the_worker_executing_it(procs: Procs, alice: User) -> None:
    procs.worker("w1")
    run = queued_run(alice, input=STREAMING)
    wait_streaming(run)

    services.run_cancel(run_id=run.pk, actor=alice, note="enough")

    gone = wait_until(lambda: released(run), what="the attempt's release")
    assert gone.outcome == AttemptOutcome.CANCELLED
    run = fresh(run)
    assert run.status == "cancelled" and run.end_code == "cancelled_by_user"
    assert gone.released_at is not None and run.ended_at is not None and gone.released_at >= run.ended_at
    last_seq = run.last_seq
    prove_worker_moved_on(alice, "w1")
    # By now the worker has finished another run: nothing of the cancelled one followed its end.
    assert fresh(run).last_seq == last_seq
    assert_nothing_after_terminal(run)
    assert delta_count(run) < STREAMING["deltas"]


def test_a_cancels_notification_stops_the_attempt_at_once_without_a_re_read(procs: Procs, alice: User) -> None:
    # A poll far away: only the notification can be how the worker learns of the cancel.
    worker = procs.worker("w1", env=subprocess_env(RUNLEDGER_POLL_SECONDS="60"))
    run = queued_run(alice, input={"deltas": 4, "delay_ms": 1, "tool": "slow", "tool_ms": 60_000})
    wait_until(lambda: "tool.started" in event_types(run), what="the tool call")

    services.run_cancel(run_id=run.pk, actor=alice)

    wait_until(lambda: released(run), what="the attempt's release")
    # The payload named the committed terminal status: no re-read, whose reason names the attempt.
    assert "stopping: the run is cancelled (learnt by notification)" in worker.log(), worker.log()


def test_a_slow_tool_that_honours_cancellation_stops_at_once(procs: Procs, alice: User) -> None:
    procs.worker("w1")
    run = queued_run(alice, input={"deltas": 4, "delay_ms": 1, "tool": "slow", "tool_ms": 60_000})
    wait_until(lambda: "tool.started" in event_types(run), what="the tool call")

    services.run_cancel(run_id=run.pk, actor=alice)

    gone = wait_until(lambda: released(run), what="the attempt's release")
    run = fresh(run)
    assert gone.released_at is not None and run.ended_at is not None
    assert gone.released_at - run.ended_at < timedelta(seconds=5)  # the tool would take a minute
    assert_tool_call_sealed(run)


def test_a_stubborn_tool_is_abandoned_and_its_late_result_never_stored(procs: Procs, alice: User) -> None:
    worker = procs.worker("w1")
    run = queued_run(alice, input={"deltas": 4, "delay_ms": 1, "tool": "stubborn", "tool_ms": 3000})
    wait_until(lambda: "tool.started" in event_types(run), what="the tool call")

    services.run_cancel(run_id=run.pk, actor=alice)

    # The tool ignores cancellation, yet the run is over and the worker let go of it promptly.
    gone = wait_until(lambda: released(run), what="the attempt's release")
    run = fresh(run)
    assert gone.outcome == AttemptOutcome.CANCELLED
    assert gone.released_at is not None and run.ended_at is not None
    assert gone.released_at - run.ended_at < timedelta(seconds=2.5)  # before the tool could finish
    # The worker is free for other work while the tool still runs.
    prove_worker_moved_on(alice, "w1")
    # Wait past the tool's duration: the worker reports when the abandoned tool finally returned.
    wait_log_line(worker, "abandoned agent task finished late", timeout=15)
    assert_tool_call_sealed(run)


def test_cancelling_the_parent_stops_its_children_in_other_workers(procs: Procs, alice: User) -> None:
    for i in range(3):
        procs.worker(f"w{i}", concurrency=1)
    parent = queued_run(alice, input={**STREAMING, "children": 2})

    def children_running() -> list[Run]:
        kids = list(Run.objects.filter(parent_id=parent.pk))
        return kids if len(kids) == 2 and all(k.status == "running" for k in kids) else []

    children = wait_until(children_running, what="both children running")
    for child in children:
        assert child.owner_id == alice.pk and child.input["children"] == 0
        wait_streaming(child, 1)
    runs = [parent, *children]
    workers = [a.worker for a in (attempt(r) for r in runs) if a is not None]
    assert len(set(workers)) == 3, workers  # parent and children each in their own worker

    services.run_cancel(run_id=parent.pk, actor=alice)

    for run in runs:
        gone = wait_until(lambda run=run: released(run), what=f"the release of {run.pk}")
        assert gone.outcome == AttemptOutcome.CANCELLED
    for child in children:
        child = fresh(child)
        assert child.status == "cancelled" and child.end_code == "parent_cancelled"
    for run in runs:
        assert_nothing_after_terminal(run)


# A run that sits in a minute-long tool call (which honours cancellation) right after it starts.
IN_A_LONG_TOOL: dict[str, Any] = {"deltas": 2, "delay_ms": 1, "tool": "slow", "tool_ms": 60_000}


def wait_in_long_tool(run: Run) -> None:
    """Wait until the run sits in its tool call with everything before it stored (its two steps
    counted too), so that no write of the attempt is in flight."""
    wait_until(
        lambda: "tool.started" in event_types(run) and fresh(run).steps_used == 2,
        what=f"run {run.pk} inside its tool call",
    )


def assert_learnt_by_rereading(worker: Proc) -> None:
    """The worker learnt of the cancellation from a periodic re-read of durable state (its run
    poll, or its heartbeat finding the attempt closed), not from a notification."""
    log = worker.log()
    assert "learnt by notification" not in log and "learnt by reconnect" not in log, log
    assert "learnt by poll" in log or "learnt by heartbeat" in log, log


def test_cancellation_arrives_when_the_listener_connection_is_killed(procs: Procs, alice: User) -> None:
    # The killed listener stays down (a long reconnect delay), so the cancellation's notification
    # reaches nobody and only the periodic re-read of durable state can deliver it.
    worker = procs.worker("w1", env=subprocess_env(RUNLEDGER_LISTEN_RECONNECT_SECONDS="120"))
    assert len(_listener_backends(worker)) == 1
    # Inside a long tool call the attempt appends nothing, so no fenced append can tell it either.
    run = queued_run(alice, input=IN_A_LONG_TOOL)
    wait_in_long_tool(run)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", _listener_backends(worker))
        assert cursor.fetchall() == [(True,)]
    wait_until(lambda: not _listener_backends(worker), what="the listener connection's end")
    wait_log_line(worker, "listener lost its connection")

    services.run_cancel(run_id=run.pk, actor=alice)

    gone = wait_until(lambda: released(run), what="the attempt's release")
    assert gone.outcome == AttemptOutcome.CANCELLED
    assert_learnt_by_rereading(worker)
    assert_nothing_after_terminal(run)


def test_cancellation_arrives_by_polling_when_notifications_are_off(procs: Procs, alice: User) -> None:
    worker = procs.worker("w1", env=subprocess_env(RUNLEDGER_WORKER_LISTEN="0"))
    assert _listener_backends(worker) == []
    run = queued_run(alice, input=IN_A_LONG_TOOL)  # claimed by polling too
    wait_in_long_tool(run)

    services.run_cancel(run_id=run.pk, actor=alice)

    gone = wait_until(lambda: released(run), what="the attempt's release")
    assert gone.outcome == AttemptOutcome.CANCELLED
    assert_learnt_by_rereading(worker)
    assert_nothing_after_terminal(run)


@pytest.mark.sqlite
def test_stopping_a_running_run_reaches_its_worker(procs: Procs, alice: User) -> None:
    procs.worker("w1")
    run = queued_run(alice, input=STREAMING)
    wait_streaming(run)

    services.run_stop(run_id=run.pk, actor=None, code="policy", reason="quota")

    gone = wait_until(lambda: released(run), what="the attempt's release")
    assert gone.outcome == AttemptOutcome.STOPPED
    assert fresh(run).end_code == "policy"
    assert_nothing_after_terminal(run)


# --- pause, input, resume -----------------------------------------------------------------------


@pytest.mark.sqlite
def test_pause_then_resume_completes_with_the_text_produced_once(procs: Procs, alice: User) -> None:
    procs.worker("w1")
    run = queued_run(alice, input={"deltas": 80, "delay_ms": 30})
    wait_streaming(run, 4)

    result = services.run_pause(run_id=run.pk)
    assert result.pending and fresh(run).status == "running"

    run = wait_status(run, "waiting")
    assert event_types(run)[-1] == "run.waiting"
    assert RunEvent.objects.get(run_id=run.pk, seq=run.last_seq).data == {"reason": "paused", "prompt": None}
    first = attempt(run)
    assert first is not None and first.outcome == AttemptOutcome.WAITING and first.released_at is not None
    paused_at = delta_count(run)
    assert 4 <= paused_at < 80

    services.run_resume(run_id=run.pk, ticket=run.resume_ticket)

    run = wait_status(run, "completed")
    assert stored_text(run) == demo_text(80)  # every chunk exactly once, in order
    assert run.output["text"] == demo_text(80)
    second = attempt(run, 2)
    assert second is not None and second.outcome == AttemptOutcome.COMPLETED
    assert RunEvent.objects.filter(run_id=run.pk, type="output.delta", attempt=2).count() == 80 - paused_at
    assert_nothing_after_terminal(run)


@pytest.mark.sqlite
def test_asking_for_input_waits_and_echoes_the_answer(procs: Procs, alice: User) -> None:
    run = asking(procs, alice, "your name?", deltas=6, delay_ms=5)
    waiting = RunEvent.objects.get(run_id=run.pk, seq=run.last_seq)
    assert waiting.type == "run.waiting" and waiting.data == {"reason": "input_required", "prompt": "your name?"}
    assert stored_text(run) == demo_text(3)  # halfway

    services.run_resume(run_id=run.pk, ticket=run.resume_ticket, input={"name": "Ada"})

    run = wait_status(run, "completed")
    assert run.output["answer"] == {"name": "Ada"}
    assert stored_text(run) == demo_text(6)
    assert_nothing_after_terminal(run)


@pytest.mark.sqlite
def test_cancelling_a_waiting_run_invalidates_its_ticket(procs: Procs, alice: User) -> None:
    run = asking(procs, alice, "go on?", deltas=4, delay_ms=1)
    ticket = run.resume_ticket

    services.run_cancel(run_id=run.pk, actor=alice)

    with pytest.raises(StaleTicket):
        services.run_resume(run_id=run.pk, ticket=ticket, input="yes")
    prove_worker_moved_on(alice, "w1")
    run = fresh(run)
    assert run.status == "cancelled" and run.generation == 1  # never executed again
    assert_nothing_after_terminal(run)


@pytest.mark.sqlite
def test_a_worker_shutting_down_requeues_what_it_holds(procs: Procs, alice: User) -> None:
    worker: Proc = procs.worker("w1")
    run = queued_run(alice, input=STREAMING)
    wait_streaming(run)

    assert worker.stop(timeout=15) == 0

    run = fresh(run)
    assert run.status == "queued" and run.lost_attempts == 0
    first = attempt(run)
    assert first is not None and first.outcome == AttemptOutcome.SHUTDOWN and first.released_at is not None
    requeued = RunEvent.objects.get(run_id=run.pk, seq=run.last_seq)
    assert requeued.type == "run.requeued" and requeued.data == {"generation": 1, "cause": "worker_shutdown"}


@pytest.mark.sqlite
def test_a_pending_pause_parks_a_run_shut_down_mid_tool_after_its_requeue_with_the_call_sealed(
    procs: Procs, alice: User
) -> None:
    # A grace far shorter than the tool: the shutdown is forced in the middle of the call.
    worker = procs.worker("w1", env=subprocess_env(RUNLEDGER_SHUTDOWN_GRACE_SECONDS="0.5"))
    run = queued_run(alice, input={"deltas": 4, "delay_ms": 1, "tool": "slow", "tool_ms": 60_000})
    wait_until(lambda: "tool.started" in event_types(run), what="the tool call")
    assert services.run_pause(run_id=run.pk).pending  # no boundary comes while the tool runs

    assert worker.stop(timeout=15) == 0

    run = fresh(run)
    assert (run.status, run.open_tool_calls, run.pause_requested_at) == ("waiting", [], None)
    events = assert_log_is_sound(run)
    assert [(e.type, e.data.get("status"), e.attempt) for e in events[-3:]] == [
        ("run.requeued", None, None),
        ("tool.finished", "interrupted", None),
        ("run.waiting", None, None),
    ]
    first = attempt(run)
    assert first is not None and first.outcome == AttemptOutcome.SHUTDOWN and first.released_at is not None

    services.run_resume(run_id=run.pk, ticket=run.resume_ticket)
    procs.worker("w2")
    # The resumed run starts the sealed call anew, with a `tool.started` of its own; the minute it
    # lasts is cut short by a cancel.
    wait_until(lambda: event_types(run).count("tool.started") == 2, what="the call started anew")
    services.run_cancel(run_id=run.pk, actor=alice)
    run = wait_status(run, "cancelled")
    events = assert_log_is_sound(run)
    calls = [(e.type, e.data.get("status"), e.attempt) for e in events if e.type.startswith("tool.")]
    assert calls == [
        ("tool.started", None, 1),
        ("tool.finished", "interrupted", None),
        ("tool.started", None, 2),
        ("tool.finished", "interrupted", None),
    ]
    assert_nothing_after_terminal(run)
