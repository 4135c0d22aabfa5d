"""Policy ends of runs executing in real worker processes: deadlines, budgets, and parents whose
end reaches their children in other workers (docs/design/commands.md#children,
docs/design/execution.md#budgets).

Every wait is for a database condition with a deadline; nothing sleeps to synchronise.
"""

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from runs.agents.demo import demo_text
from runs.models import AttemptOutcome, Run
from tests.factories import queued_run
from tests.support.checks import assert_nothing_after_terminal
from tests.support.procs import Proc, Procs
from tests.support.runs import attempt, delta_count, deltas_of, fresh, released, stored_text
from tests.support.waiting import wait_until
from tests.support.workers import prove_worker_moved_on, wait_status, wait_streaming

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

# Children that stream for about ten seconds unless something ends them.
LONG_CHILD: dict[str, Any] = {"deltas": 500, "delay_ms": 20}


def assert_released_by_its_worker(run: Run, outcome: AttemptOutcome) -> None:
    gone = wait_until(lambda: released(run, fresh(run).generation), what=f"the release of {run.pk}")
    assert gone.outcome == outcome


# --- deadlines -------------------------------------------------------------------------------------


@pytest.mark.sqlite
def test_runs_past_their_deadline_are_stopped_whether_queued_running_or_waiting(procs: Procs, alice: User) -> None:
    procs.worker("w1", concurrency=1)
    deadline = timezone.now() + timedelta(seconds=4)
    waiting = queued_run(alice, input={"deltas": 4, "delay_ms": 1, "ask": "go on?"}, deadline=deadline)
    wait_status(waiting, "waiting")
    running = queued_run(alice, input={"deltas": 500, "delay_ms": 20}, deadline=deadline)
    wait_streaming(running, 2)
    queued = queued_run(alice, input={"deltas": 2, "delay_ms": 1}, deadline=deadline)  # the worker is busy

    for run in (waiting, running, queued):
        run = wait_status(run, "stopped", timeout=15)
        assert (run.end_code, run.ended_by) == ("deadline_exceeded", "system")
        assert run.end_reason.startswith("deadline ") and run.ended_at is not None and run.ended_at >= deadline
        assert run.resume_ticket == ""
        assert_nothing_after_terminal(run)
    assert_released_by_its_worker(running, AttemptOutcome.STOPPED)
    assert delta_count(running) < 500
    assert fresh(queued).generation == 0  # never started
    prove_worker_moved_on(alice, "w1")


# --- budgets ---------------------------------------------------------------------------------------


@pytest.mark.sqlite
def test_budget_overruns_stop_runs_budget_exhausted_never_cancelled(procs: Procs, alice: User) -> None:
    procs.worker("w1", concurrency=2)
    by_events = queued_run(alice, input={"deltas": 40, "delay_ms": 5}, max_events=10)
    # Two model turns (one before the halfway point, one after it): the second is over budget.
    by_steps = queued_run(alice, input={"deltas": 10, "delay_ms": 5}, max_steps=1)

    by_events = wait_status(by_events, "stopped", "cancelled", "completed")
    by_steps = wait_status(by_steps, "stopped", "cancelled", "completed")

    assert (by_events.status, by_events.end_code, by_events.end_reason) == (
        "stopped",
        "budget_exhausted",
        "max_events budget of 10 exhausted",
    )
    assert by_events.events_used == 11 and stored_text(by_events) == demo_text(10)  # and the stop
    assert (by_steps.status, by_steps.end_code, by_steps.end_reason) == (
        "stopped",
        "budget_exhausted",
        "max_steps budget of 1 exhausted",
    )
    # The step past the budget never started: none of its chunks were emitted.
    assert by_steps.steps_used == 1 and stored_text(by_steps) == demo_text(5)
    for run in (by_events, by_steps):
        assert run.ended_by == "system"
        assert_released_by_its_worker(run, AttemptOutcome.STOPPED)
        assert_nothing_after_terminal(run)


def test_budgets_count_across_attempts(procs: Procs, alice: User) -> None:
    workers = {w: procs.worker(w) for w in ("w1", "w2")}
    run = queued_run(alice, input={"deltas": 200, "delay_ms": 40}, max_events=60)
    wait_streaming(run, 10)
    first = attempt(run)
    assert first is not None
    assert workers[first.worker].stop(timeout=15) == 0  # requeued at a safe boundary, not lost

    run = wait_status(run, "stopped", timeout=30)
    assert (run.end_code, run.end_reason) == ("budget_exhausted", "max_events budget of 60 exhausted")
    assert (run.generation, run.lost_attempts) == (2, 0)
    assert deltas_of(run, 1) >= 10 and deltas_of(run, 2) == 60 - deltas_of(run, 1) > 0
    assert stored_text(run) == demo_text(60)
    assert_nothing_after_terminal(run)


# --- a parent's end reaches its children in other workers ----------------------------------------


def children_running(parent: Run, n: int) -> list[Run]:
    kids = list(Run.objects.filter(parent_id=parent.pk))
    if len(kids) != n or any(k.status != "running" for k in kids):
        return []
    return kids if all(delta_count(k) >= 1 for k in kids) else []


def assert_children_ended_in_their_workers(parent: Run, children: list[Run], status: str, code: str) -> None:
    parent = fresh(parent)
    workers = {a.worker for a in (attempt(r) for r in [parent, *children]) if a is not None}
    assert len(workers) == 3, workers  # the parent and each child in a worker of its own
    for child in children:
        assert_released_by_its_worker(child, AttemptOutcome(status))
        child = fresh(child)
        assert (child.status, child.end_code, child.ended_by) == (status, code, "system")
        child_attempt = attempt(child)
        assert child_attempt is not None and parent.ended_at is not None
        assert child_attempt.claimed_at < parent.ended_at  # it was executing when the parent ended
        assert delta_count(child) < LONG_CHILD["deltas"]
        assert_nothing_after_terminal(child)


def start_three(procs: Procs) -> dict[str, Proc]:
    return {w: procs.worker(w, concurrency=1) for w in ("w1", "w2", "w3")}


def test_a_completed_parent_ends_its_children_running_in_other_workers(procs: Procs, alice: User) -> None:
    start_three(procs)
    parent = queued_run(
        alice, input={"deltas": 40, "delay_ms": 50, "children": 2, "child_input": LONG_CHILD}
    )  # about two seconds
    children = wait_until(lambda: children_running(parent, 2), what="both children running")

    parent = wait_status(parent, "completed", timeout=15)

    assert parent.output["text"] == demo_text(40)
    assert_children_ended_in_their_workers(parent, children, "cancelled", "parent_ended")


def test_a_parent_stopped_by_its_budget_stops_its_children_in_other_workers(procs: Procs, alice: User) -> None:
    start_three(procs)
    # Two child.spawned events and 30 chunks fit the budget; the 31st chunk does not.
    parent = queued_run(
        alice, input={"deltas": 100, "delay_ms": 60, "children": 2, "child_input": LONG_CHILD}, max_events=32
    )
    children = wait_until(lambda: children_running(parent, 2), what="both children running")

    parent = wait_status(parent, "stopped", timeout=15)

    assert (parent.end_code, parent.end_reason) == ("budget_exhausted", "max_events budget of 32 exhausted")
    assert stored_text(parent) == demo_text(30)
    assert_children_ended_in_their_workers(parent, children, "stopped", "parent_stopped")


def test_a_parent_failed_by_losing_its_worker_ends_its_children_in_other_workers(procs: Procs, alice: User) -> None:
    workers = start_three(procs)
    parent = queued_run(
        alice, input={"deltas": 500, "delay_ms": 20, "children": 2, "child_input": LONG_CHILD}, max_attempts=1
    )
    children = wait_until(lambda: children_running(parent, 2), what="both children running")
    parent_attempt = attempt(parent)
    assert parent_attempt is not None

    workers[parent_attempt.worker].kill()

    parent = wait_status(parent, "failed", timeout=15)  # by another worker's sweeper
    assert parent.end_code == "worker_lost"
    assert_children_ended_in_their_workers(parent, children, "cancelled", "parent_ended")
