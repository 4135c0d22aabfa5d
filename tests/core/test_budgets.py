"""Budgets (`max_events`, `max_steps`) enforced by the services, and retried writes that must not
count or store anything twice (docs/design/execution.md#budgets)."""

import pytest
from django.contrib.auth.models import User

from runs import services
from runs.exceptions import BudgetExhausted, StaleAttempt
from runs.models import AttemptOutcome, Run, RunAttempt, RunEvent
from tests.factories import assert_log_is_sound, running_run
from tests.support.runs import assert_stopped_by_the_system
from tests.support.threads import race

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite]


def deltas(n: int, start: int = 0) -> list[tuple[str, dict[str, object]]]:
    return [("output.delta", {"text": f"chunk {i} "}) for i in range(start, start + n)]


def agent_events(run: Run) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run=run, type="output.delta").order_by("seq"))


def assert_stopped_by_budget(run: Run, budget: str, limit: int) -> None:
    reason = f"{budget} budget of {limit} exhausted"
    run.refresh_from_db()
    assert_stopped_by_the_system(run, "budget_exhausted", reason, partial_output=run.partial_events > 0)
    # Closed by the platform; the worker records its release once it has stopped.
    attempt = RunAttempt.objects.get(run=run, generation=run.generation)
    assert (attempt.outcome, attempt.released_at) == (AttemptOutcome.STOPPED, None)
    assert_log_is_sound(run)


# --- max_events ------------------------------------------------------------------------------------


def test_an_append_past_max_events_stores_what_fits_and_stops_the_run(alice: User) -> None:
    run = running_run(alice, max_events=5)
    services.run_events_append(run_id=run.pk, generation=1, events=deltas(3))

    with pytest.raises(StaleAttempt, match="max_events budget of 5 exhausted"):
        services.run_events_append(run_id=run.pk, generation=1, events=deltas(4, start=3))

    assert [e.data["text"] for e in agent_events(run)] == [f"chunk {i} " for i in range(5)]
    run.refresh_from_db()
    assert run.events_used == 6  # the five that fit, and the stop, which counts but is never refused
    assert_stopped_by_budget(run, "max_events", 5)
    with pytest.raises(StaleAttempt):  # nothing follows the terminal event
        services.run_events_append(run_id=run.pk, generation=1, events=deltas(1, start=5))


def test_appending_exactly_up_to_the_budget_keeps_the_run_going(alice: User) -> None:
    run = running_run(alice, max_events=4)
    services.run_events_append(run_id=run.pk, generation=1, events=deltas(4))
    completed = services.run_complete(run_id=run.pk, generation=1, output={"ok": True})
    assert (completed.status, completed.events_used) == ("completed", 4)


def test_max_events_counts_across_attempts(alice: User) -> None:
    run = running_run(alice, max_events=5)
    services.run_events_append(run_id=run.pk, generation=1, events=deltas(3))
    services.run_requeue(run_id=run.pk, generation=1, cause="worker_shutdown")
    assert services.run_claim(worker="w2") is not None
    services.run_events_append(run_id=run.pk, generation=2, events=deltas(2, start=3))

    with pytest.raises(StaleAttempt, match="max_events budget of 5 exhausted"):
        services.run_events_append(run_id=run.pk, generation=2, events=deltas(1, start=5))

    assert len(agent_events(run)) == 5
    assert_stopped_by_budget(run, "max_events", 5)


def test_lifecycle_events_do_not_count_against_max_events(alice: User) -> None:
    # run.created, run.started and run.requeued are the platform's record of the run's life.
    run = running_run(alice, max_events=1)
    services.run_requeue(run_id=run.pk, generation=1, cause="worker_shutdown")
    assert services.run_claim(worker="w2") is not None
    services.run_events_append(run_id=run.pk, generation=2, events=deltas(1))
    run.refresh_from_db()
    assert (run.status, run.events_used) == ("running", 1)


def test_a_child_spawn_counts_against_max_events_and_the_stop_reaches_the_children(alice: User) -> None:
    parent = running_run(alice, max_events=1)
    child = services.run_child_spawn(run_id=parent.pk, generation=1, input={"deltas": 1})

    with pytest.raises(StaleAttempt, match="max_events budget of 1 exhausted"):
        services.run_child_spawn(run_id=parent.pk, generation=1, input={"deltas": 1})

    assert Run.objects.filter(parent=parent).count() == 1  # no second child
    assert_stopped_by_budget(parent, "max_events", 1)
    child.refresh_from_db()
    assert (child.status, child.end_code) == ("stopped", "parent_stopped")


def test_concurrent_appends_never_overrun_max_events(alice: User) -> None:
    run = running_run(alice, max_events=10)

    def append(i: int) -> object:
        return services.run_events_append(run_id=run.pk, generation=1, events=deltas(3, start=3 * i))

    results = race(6, append)

    assert sum(isinstance(r, StaleAttempt) for r in results) >= 1
    run.refresh_from_db()
    assert run.events_used == 11 and len(agent_events(run)) == 10  # the ten that fit, and the stop
    assert_stopped_by_budget(run, "max_events", 10)


# --- the events commands write (pause, resume, cancel, stop) ----------------------------------------


def tool_started(call_id: str) -> tuple[str, dict[str, object]]:
    return ("tool.started", {"call_id": call_id, "name": "slow", "arguments": {}})


def test_a_cancel_counts_its_seals_and_its_event_even_past_max_events(alice: User) -> None:
    run = running_run(alice, max_events=2)
    services.run_events_append(run_id=run.pk, generation=1, events=[tool_started("c1"), *deltas(1)])

    cancelled = services.run_cancel(run_id=run.pk, actor=alice).run

    assert cancelled.status == "cancelled"
    assert cancelled.events_used == 4  # the two the budget holds, the seal of c1 and run.cancelled
    assert Run.objects.get(pk=run.pk).events_used == 4
    assert_log_is_sound(run)


def test_a_pause_of_a_running_run_without_room_for_its_park_is_refused_and_records_nothing(alice: User) -> None:
    # The park would write a seal for the open call and run.waiting: two events, one is left.
    run = running_run(alice, max_events=3)
    services.run_events_append(run_id=run.pk, generation=1, events=[tool_started("c1"), *deltas(1)])
    before = list(RunEvent.objects.filter(run=run).values_list("seq", flat=True))

    with pytest.raises(BudgetExhausted) as refused:
        services.run_pause(run_id=run.pk)

    assert refused.value.run is not None and refused.value.run.pk == run.pk
    run.refresh_from_db()
    assert (run.status, run.pause_requested_at, run.events_used) == ("running", None, 2)
    assert list(RunEvent.objects.filter(run=run).values_list("seq", flat=True)) == before


def test_a_park_the_agent_filled_the_budget_before_stops_the_run_budget_exhausted(alice: User) -> None:
    run = running_run(alice, max_events=3)
    services.run_events_append(run_id=run.pk, generation=1, events=deltas(2))
    assert services.run_pause(run_id=run.pk).pending  # room for run.waiting when asked
    services.run_events_append(run_id=run.pk, generation=1, events=deltas(1, start=2))  # no room left

    with pytest.raises(StaleAttempt, match="max_events budget of 3 exhausted"):
        services.run_wait(run_id=run.pk, generation=1, reason="paused")

    assert_stopped_by_budget(run, "max_events", 3)
    assert "run.waiting" not in [e.type for e in RunEvent.objects.filter(run=run)]


def test_a_requeue_whose_pending_pause_has_no_room_stops_the_run_budget_exhausted(alice: User) -> None:
    run = running_run(alice, max_events=1)
    assert services.run_pause(run_id=run.pk).pending
    services.run_events_append(run_id=run.pk, generation=1, events=deltas(1))

    stopped = services.run_requeue(run_id=run.pk, generation=1, cause="worker_shutdown")

    assert (stopped.status, stopped.end_code, stopped.end_reason) == (
        "stopped",
        "budget_exhausted",
        "max_events budget of 1 exhausted",
    )
    events = assert_log_is_sound(run)
    assert [e.type for e in events][-2:] == ["run.requeued", "run.stopped"]
    assert RunAttempt.objects.get(run=run).outcome == AttemptOutcome.SHUTDOWN


# --- max_steps -------------------------------------------------------------------------------------


def test_steps_past_max_steps_stop_the_run_and_are_not_counted(alice: User) -> None:
    run = running_run(alice, max_steps=2)
    services.run_steps_record(run_id=run.pk, generation=1, steps=1)

    with pytest.raises(StaleAttempt, match="max_steps budget of 2 exhausted"):
        services.run_steps_record(run_id=run.pk, generation=1, steps=2)

    run.refresh_from_db()
    assert run.steps_used == 2
    assert_stopped_by_budget(run, "max_steps", 2)


def test_max_steps_counts_across_attempts(alice: User) -> None:
    run = running_run(alice, max_steps=3)
    services.run_steps_record(run_id=run.pk, generation=1, steps=2)
    services.run_requeue(run_id=run.pk, generation=1, cause="lease_expired")
    assert services.run_claim(worker="w2") is not None
    services.run_steps_record(run_id=run.pk, generation=2, steps=1)

    with pytest.raises(StaleAttempt, match="max_steps budget of 3 exhausted"):
        services.run_steps_record(run_id=run.pk, generation=2, steps=1)

    assert_stopped_by_budget(run, "max_steps", 3)


def test_a_run_without_budgets_is_never_stopped_for_one(alice: User) -> None:
    run = running_run(alice)
    services.run_events_append(run_id=run.pk, generation=1, events=deltas(300))
    services.run_steps_record(run_id=run.pk, generation=1, steps=100)
    run.refresh_from_db()
    assert (run.status, run.events_used, run.steps_used) == ("running", 300, 100)


# --- retried writes ----------------------------------------------------------------------------------


def test_a_retried_append_that_had_committed_stores_nothing_twice(alice: User) -> None:
    run = running_run(alice)
    seen = run.last_seq  # what the attempt knows before it sends
    first = services.run_events_append(run_id=run.pk, generation=1, events=deltas(3), after_seq=seen)

    # The connection dropped before the answer came back; the worker sends the same batch again.
    again = services.run_events_append(run_id=run.pk, generation=1, events=deltas(3), after_seq=seen)

    assert [e.pk for e in again] == [e.pk for e in first]
    run.refresh_from_db()
    assert (run.last_seq, run.events_used, len(agent_events(run))) == (seen + 3, 3, 3)
    # The attempt goes on from there.
    services.run_events_append(run_id=run.pk, generation=1, events=deltas(1, start=3), after_seq=seen + 3)
    assert len(agent_events(run)) == 4
    assert_log_is_sound(run)


def test_an_append_that_expects_another_log_writes_nothing(alice: User) -> None:
    run = running_run(alice)
    seen = run.last_seq
    services.run_events_append(run_id=run.pk, generation=1, events=deltas(2), after_seq=seen)

    # Neither the same batch (it was another) nor a stale view of the log may be stored.
    with pytest.raises(StaleAttempt, match="expected last seq"):
        services.run_events_append(run_id=run.pk, generation=1, events=deltas(2, start=5), after_seq=seen)
    with pytest.raises(StaleAttempt, match="expected last seq"):
        services.run_events_append(run_id=run.pk, generation=1, events=deltas(1), after_seq=seen - 1)
    assert len(agent_events(run)) == 2


def test_a_retried_step_record_counts_once(alice: User) -> None:
    run = running_run(alice, max_steps=10)
    services.run_steps_record(run_id=run.pk, generation=1, steps=2, after_steps=0)
    services.run_steps_record(run_id=run.pk, generation=1, steps=2, after_steps=0)  # the retry
    run.refresh_from_db()
    assert run.steps_used == 2
    with pytest.raises(StaleAttempt, match="expected 5 steps"):
        services.run_steps_record(run_id=run.pk, generation=1, steps=1, after_steps=5)


def test_a_retried_spawn_makes_one_child(alice: User) -> None:
    parent = running_run(alice)
    seen = parent.last_seq
    child = services.run_child_spawn(run_id=parent.pk, generation=1, input={"deltas": 1}, after_seq=seen)
    again = services.run_child_spawn(run_id=parent.pk, generation=1, input={"deltas": 1}, after_seq=seen)
    assert again.pk == child.pk
    assert Run.objects.filter(parent=parent).count() == 1


def test_a_retry_after_the_run_moved_on_is_refused(alice: User) -> None:
    run = running_run(alice)
    seen = run.last_seq
    services.run_events_append(run_id=run.pk, generation=1, events=deltas(1), after_seq=seen)
    services.run_requeue(run_id=run.pk, generation=1, cause="lease_expired")
    with pytest.raises(StaleAttempt):
        services.run_events_append(run_id=run.pk, generation=1, events=deltas(1), after_seq=seen)
    run.refresh_from_db()
    assert run.status == "queued" and len(agent_events(run)) == 1
