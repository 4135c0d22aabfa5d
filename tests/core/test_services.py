from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from runs import services
from runs.events import WaitReason
from runs.exceptions import InvalidTransition, NotFound, StaleAttempt, StaleTicket, ValidationFailed
from runs.models import Run, RunAttempt, RunEvent
from runs.transitions import FailCode
from tests.factories import assert_log_is_sound, queued_run, running_run, waiting_run
from tests.support.runs import event_types

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def count_events() -> int:
    return RunEvent.objects.count()


# --- create ----------------------------------------------------------------------------------


def test_create_stores_a_queued_run_with_its_created_event(alice: User) -> None:
    run = queued_run(alice, input={"deltas": 2, "tool": None})
    run.refresh_from_db()
    assert (run.status, run.last_seq, run.generation, run.owner_id) == ("queued", 1, 0, alice.pk)
    (event,) = RunEvent.objects.filter(run=run)
    assert (event.seq, event.type, event.attempt) == (1, "run.created", None)
    assert event.data == {"agent": "demo", "input_keys": ["deltas", "tool"], "parent": None}


def test_create_rejects_an_unknown_agent_and_writes_nothing(alice: User) -> None:
    with pytest.raises(ValidationFailed, match="unknown agent"):
        services.run_create(owner=alice, agent="nope", input={})
    assert Run.objects.count() == 0


@pytest.mark.parametrize("field", ["max_steps", "max_events", "max_attempts"])
def test_create_rejects_budgets_below_one(alice: User, field: str) -> None:
    with pytest.raises(ValidationFailed):
        services.run_create(owner=alice, agent="demo", input={}, **{field: 0})
    assert Run.objects.count() == 0


def test_a_child_cannot_be_created_under_a_terminal_parent(alice: User) -> None:
    parent = queued_run(alice)
    services.run_cancel(run_id=parent.pk, actor=alice)
    with pytest.raises(InvalidTransition) as info:
        queued_run(alice, parent_id=parent.pk)
    assert info.value.run is not None and info.value.run.pk == parent.pk
    assert info.value.run.status == "cancelled"
    assert Run.objects.count() == 1


def test_create_under_a_missing_parent_is_not_found(alice: User) -> None:
    with pytest.raises(NotFound):
        queued_run(alice, parent_id="00000000-0000-0000-0000-000000000000")


# --- claim, append, complete, fail -------------------------------------------------------------


def test_claim_opens_the_next_attempt_and_nothing_when_the_queue_is_empty(alice: User) -> None:
    assert services.run_claim(worker="w") is None
    run = queued_run(alice)
    claimed = services.run_claim(worker="w1")
    assert claimed is not None
    claimed_run, attempt = claimed
    assert (claimed_run.pk, claimed_run.status, claimed_run.generation) == (run.pk, "running", 1)
    assert (attempt.generation, attempt.worker, attempt.outcome, attempt.released_at) == (1, "w1", "", None)
    assert attempt.lease_expires_at > attempt.claimed_at
    assert event_types(run) == ["run.created", "run.started"]
    assert RunEvent.objects.get(run=run, seq=2).attempt == 1
    assert services.run_claim(worker="w2") is None


def test_append_takes_many_events_in_one_call_with_consecutive_seq(alice: User) -> None:
    run = running_run(alice)
    rows = services.run_events_append(
        run_id=run.pk, generation=1, events=[("output.delta", {"text": t}) for t in "abc"]
    )
    assert [r.seq for r in rows] == [3, 4, 5]
    run.refresh_from_db()
    assert (run.last_seq, run.events_used) == (5, 3)
    assert all(r.attempt == 1 for r in rows)


def test_an_agent_cannot_append_lifecycle_events(alice: User) -> None:
    run = running_run(alice)
    with pytest.raises(ValidationFailed):
        services.run_events_append(run_id=run.pk, generation=1, events=[("run.completed", {})])
    assert event_types(run) == ["run.created", "run.started"]


def test_append_from_a_stale_generation_is_rejected_and_writes_nothing(alice: User) -> None:
    run = running_run(alice)
    services.run_requeue(run_id=run.pk, generation=1, cause="worker_shutdown")
    claimed = services.run_claim(worker="w2")
    assert claimed is not None and claimed[0].generation == 2
    before = count_events()
    with pytest.raises(StaleAttempt):
        services.run_events_append(run_id=run.pk, generation=1, events=[("output.delta", {"text": "late"})])
    with pytest.raises(StaleAttempt):
        services.run_complete(run_id=run.pk, generation=1, output="late")
    assert count_events() == before
    assert_log_is_sound(run)


def test_append_after_the_terminal_event_is_rejected_and_writes_nothing(alice: User) -> None:
    run = running_run(alice)
    services.run_cancel(run_id=run.pk, actor=alice)
    before = count_events()
    with pytest.raises(StaleAttempt) as info:
        services.run_events_append(run_id=run.pk, generation=1, events=[("output.delta", {"text": "late"})])
    assert info.value.run is not None and info.value.run.status == "cancelled"
    assert count_events() == before
    assert event_types(run)[-1] == "run.cancelled"


def test_complete_and_fail_end_the_run_with_one_terminal_event(alice: User) -> None:
    done = running_run(alice)
    services.run_complete(run_id=done.pk, generation=1, output={"text": "hi"})
    done.refresh_from_db()
    assert (done.status, done.output, done.end_code, done.ended_at is not None) == (
        "completed",
        {"text": "hi"},
        "",
        True,
    )
    attempt = RunAttempt.objects.get(run=done)
    assert attempt.outcome == "completed" and attempt.released_at is not None
    assert_log_is_sound(done)

    broken = running_run(alice)
    services.run_fail(run_id=broken.pk, generation=1, code=FailCode.AGENT_ERROR, reason="boom", error={"x": 1})
    broken.refresh_from_db()
    assert (broken.status, broken.end_code, broken.end_reason, broken.error) == (
        "failed",
        "agent_error",
        "boom",
        {"x": 1},
    )
    assert RunEvent.objects.get(run=broken, seq=broken.last_seq).data == {
        "code": "agent_error",
        "reason": "boom",
        "error": {"x": 1},
        "partial_output": False,
    }


def test_heartbeat_renews_only_the_current_attempt(alice: User) -> None:
    run = running_run(alice)
    before = RunAttempt.objects.get(run=run).lease_expires_at
    assert services.run_attempt_heartbeat(run_id=run.pk, generation=1)
    assert RunAttempt.objects.get(run=run).lease_expires_at >= before
    assert not services.run_attempt_heartbeat(run_id=run.pk, generation=2)
    services.run_cancel(run_id=run.pk, actor=alice)
    assert not services.run_attempt_heartbeat(run_id=run.pk, generation=1)


# --- cancel ----------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [queued_run, running_run, waiting_run], ids=["queued", "running", "waiting"])
def test_cancel_ends_a_live_run_with_one_cancelled_event(alice: User, make: object) -> None:
    run = make(alice)  # type: ignore[operator]
    result = services.run_cancel(run_id=run.pk, actor=alice, note="changed my mind")
    assert result.changed
    run.refresh_from_db()
    assert (run.status, run.end_code, run.end_reason, run.ended_by) == (
        "cancelled",
        "cancelled_by_user",
        "changed my mind",
        "alice",
    )
    assert run.resume_ticket == ""
    last = RunEvent.objects.get(run=run, seq=run.last_seq)
    assert (last.type, last.attempt) == ("run.cancelled", None)
    assert last.data == {"code": "cancelled_by_user", "note": "changed my mind", "by": "alice", "partial_output": False}
    assert_log_is_sound(run)


def test_cancel_of_a_running_run_closes_its_attempt_but_leaves_released_to_the_worker(alice: User) -> None:
    run = running_run(alice)
    services.run_cancel(run_id=run.pk, actor=alice)
    attempt = RunAttempt.objects.get(run=run)
    assert (attempt.outcome, attempt.released_at) == ("cancelled", None)
    services.run_attempt_release(run_id=run.pk, generation=1)
    assert RunAttempt.objects.get(run=run).released_at is not None


def test_repeated_cancels_write_nothing(alice: User) -> None:
    run = running_run(alice)
    services.run_cancel(run_id=run.pk, actor=alice)
    before = count_events()
    for _ in range(3):
        result = services.run_cancel(run_id=run.pk, actor=alice, note="again")
        assert not result.changed and result.run.status == "cancelled"
    assert count_events() == before
    run.refresh_from_db()
    assert run.end_reason == ""


def test_cancel_of_a_run_that_ended_otherwise_reports_the_committed_state(alice: User) -> None:
    run = running_run(alice)
    services.run_complete(run_id=run.pk, generation=1, output="done")
    before = count_events()
    with pytest.raises(InvalidTransition) as info:
        services.run_cancel(run_id=run.pk, actor=alice)
    assert info.value.run is not None and info.value.run.status == "completed"
    assert count_events() == before


def test_cancel_by_another_user_is_a_staff_cancel(alice: User, bob: User) -> None:
    run = running_run(alice)
    services.run_cancel(run_id=run.pk, actor=bob)
    run.refresh_from_db()
    assert (run.end_code, run.ended_by) == ("cancelled_by_staff", "bob")


def test_resume_after_cancel_fails_closed(alice: User) -> None:
    run = waiting_run(alice)
    ticket = run.resume_ticket
    assert ticket
    services.run_cancel(run_id=run.pk, actor=alice)
    before = count_events()
    with pytest.raises(StaleTicket) as info:
        services.run_resume(run_id=run.pk, ticket=ticket, input="late")
    assert info.value.run is not None and info.value.run.status == "cancelled"
    assert count_events() == before


# --- stop ------------------------------------------------------------------------------------


def test_stop_records_code_reason_and_actor(alice: User, bob: User) -> None:
    run = running_run(alice)
    result = services.run_stop(run_id=run.pk, actor=bob, code="policy", reason="too expensive")
    assert result.changed
    run.refresh_from_db()
    assert (run.status, run.end_code, run.end_reason, run.ended_by) == ("stopped", "policy", "too expensive", "bob")
    assert RunEvent.objects.get(run=run, seq=run.last_seq).data == {
        "code": "policy",
        "reason": "too expensive",
        "by": "bob",
        "partial_output": False,
    }


@pytest.mark.parametrize("code,reason", [("parent_stopped", "x"), ("whatever", "x"), ("staff", ""), ("staff", "   ")])
def test_stop_refuses_a_bad_code_or_a_missing_reason(alice: User, code: str, reason: str) -> None:
    run = running_run(alice)
    before = count_events()
    with pytest.raises(ValidationFailed):
        services.run_stop(run_id=run.pk, actor=alice, code=code, reason=reason)
    assert count_events() == before
    run.refresh_from_db()
    assert run.status == "running"


def test_stop_repeat_writes_nothing_and_stop_after_cancel_is_a_conflict(alice: User) -> None:
    stopped = running_run(alice)
    services.run_stop(run_id=stopped.pk, actor=None, reason="first")
    before = count_events()
    assert not services.run_stop(run_id=stopped.pk, actor=alice, reason="second").changed
    assert count_events() == before
    stopped.refresh_from_db()
    assert (stopped.end_reason, stopped.ended_by) == ("first", "system")

    cancelled = running_run(alice)
    services.run_cancel(run_id=cancelled.pk, actor=alice)
    with pytest.raises(InvalidTransition) as info:
        services.run_stop(run_id=cancelled.pk, actor=alice, reason="late")
    assert info.value.run is not None and info.value.run.status == "cancelled"


# --- pause and resume ------------------------------------------------------------------------


def test_pause_of_a_queued_run_parks_it_at_once_with_a_ticket(alice: User) -> None:
    run = queued_run(alice)
    result = services.run_pause(run_id=run.pk)
    assert (result.changed, result.pending, result.run.status) == (True, False, "waiting")
    assert result.run.resume_ticket
    assert RunEvent.objects.get(run=run, seq=2).data == {"reason": "paused", "prompt": None}


def test_pause_of_a_running_run_is_a_pending_request_until_the_worker_acts(alice: User) -> None:
    run = running_run(alice)
    first = services.run_pause(run_id=run.pk)
    assert (first.changed, first.pending, first.run.status) == (True, True, "running")
    requested = first.run.pause_requested_at
    assert requested is not None
    again = services.run_pause(run_id=run.pk)
    assert (again.changed, again.pending, again.run.pause_requested_at) == (False, True, requested)

    parked = services.run_wait(run_id=run.pk, generation=1, reason="paused")
    assert (parked.status, parked.pause_requested_at) == ("waiting", None)
    attempt = RunAttempt.objects.get(run=run)
    assert attempt.outcome == "waiting" and attempt.released_at is not None
    assert RunEvent.objects.get(run=run, seq=parked.last_seq).attempt == 1


def test_pause_of_a_waiting_run_changes_nothing_and_of_a_terminal_run_conflicts(alice: User) -> None:
    run = waiting_run(alice)
    before = count_events()
    assert not services.run_pause(run_id=run.pk).changed
    assert count_events() == before
    services.run_cancel(run_id=run.pk, actor=alice)
    with pytest.raises(InvalidTransition):
        services.run_pause(run_id=run.pk)


def test_resume_needs_the_current_ticket_and_uses_it_once(alice: User) -> None:
    run = waiting_run(alice)
    ticket = run.resume_ticket
    with pytest.raises(ValidationFailed):
        services.run_resume(run_id=run.pk, ticket="")
    with pytest.raises(StaleTicket):
        services.run_resume(run_id=run.pk, ticket="not-the-ticket")
    run.refresh_from_db()
    assert run.status == "waiting"

    resumed = services.run_resume(run_id=run.pk, ticket=ticket, input={"name": "Ada"}).run
    assert (resumed.status, resumed.resume_ticket) == ("queued", "")
    assert RunEvent.objects.get(run=run, seq=resumed.last_seq).data == {"ticket": ticket, "input": {"name": "Ada"}}
    # Used with another input, the ticket is stale.
    with pytest.raises(StaleTicket):
        services.run_resume(run_id=run.pk, ticket=ticket)
    with pytest.raises(StaleTicket):
        services.run_resume(run_id=run.pk, ticket=ticket, input={"name": "Bob"})


def test_a_retried_resume_answers_the_run_and_writes_nothing_until_the_run_waits_again(alice: User) -> None:
    run = waiting_run(alice)
    ticket = run.resume_ticket
    services.run_resume(run_id=run.pk, ticket=ticket, input={"name": "Ada", "n": [1, 2]})
    before = count_events()

    retried = services.run_resume(run_id=run.pk, ticket=ticket, input={"n": [1, 2], "name": "Ada"})  # equal as JSON
    assert (retried.run.status, retried.changed) == ("queued", False) and count_events() == before
    assert event_types(run).count("run.resumed") == 1
    # Still the latest resume after the run started and ended: the retry learns the outcome.
    claimed = services.run_claim(worker="w")
    assert claimed is not None
    services.run_complete(run_id=run.pk, generation=claimed[0].generation, output=None)
    assert (
        services.run_resume(run_id=run.pk, ticket=ticket, input={"name": "Ada", "n": [1, 2]}).run.status == "completed"
    )

    # Once the run waits again, the old ticket is stale whatever the input.
    again = waiting_run(alice)
    first = again.resume_ticket
    services.run_resume(run_id=again.pk, ticket=first)
    claimed = services.run_claim(worker="w")
    assert claimed is not None
    services.run_wait(run_id=again.pk, generation=claimed[0].generation, reason=WaitReason.PAUSED)
    with pytest.raises(StaleTicket):
        services.run_resume(run_id=again.pk, ticket=first)


def test_a_second_wait_issues_a_new_ticket_and_the_old_one_is_stale(alice: User) -> None:
    run = waiting_run(alice)
    old = run.resume_ticket
    services.run_resume(run_id=run.pk, ticket=old)
    claimed = services.run_claim(worker="w")
    assert claimed is not None
    again = services.run_wait(run_id=run.pk, generation=2, reason="paused")
    assert again.resume_ticket and again.resume_ticket != old
    with pytest.raises(StaleTicket):
        services.run_resume(run_id=run.pk, ticket=old)


def test_a_resume_retry_is_the_same_input_only_as_json_and_true_is_not_1(alice: User) -> None:
    # The rule of an idempotent create's "the same body": 1 is 1.0 (one JSON number), key order
    # does not matter, but true is not 1, whatever Python's == says.
    run = waiting_run(alice)
    ticket = run.resume_ticket
    services.run_resume(run_id=run.pk, ticket=ticket, input={"ok": True, "n": 1})
    before = count_events()

    assert services.run_resume(run_id=run.pk, ticket=ticket, input={"n": 1.0, "ok": True}).run.status == "queued"
    for other in ({"ok": 1, "n": 1}, {"ok": True, "n": True}, {"ok": True, "n": "1"}):
        with pytest.raises(StaleTicket):
            services.run_resume(run_id=run.pk, ticket=ticket, input=other)
    assert count_events() == before


def test_a_resume_input_is_checked_like_a_creates_and_a_refused_one_writes_nothing(alice: User) -> None:
    run = waiting_run(alice)
    refused = [
        ({"tool": "hammer"}, "input of agent 'demo': tool must be one of"),  # the agent's own check
        ({"x": float("nan")}, r"input cannot be stored: \$\.x: nan is not a finite number"),
        ("a\x00b", "input cannot be stored: .*NUL"),
        ({"pad": "x" * settings.DATA_UPLOAD_MAX_MEMORY_SIZE}, "input cannot be stored: .* bytes of JSON, more than"),
    ]
    for input, says in refused:
        with pytest.raises(ValidationFailed, match=says) as caught:
            services.run_resume(run_id=run.pk, ticket=run.resume_ticket, input=input)
        assert "input" in caught.value.detail
    after = Run.objects.get(pk=run.pk)
    assert (after.status, after.resume_ticket, after.last_seq) == ("waiting", run.resume_ticket, run.last_seq)
    # Any storable JSON value the agent does not refuse is an answer.
    assert services.run_resume(run_id=run.pk, ticket=run.resume_ticket, input="Ada").run.status == "queued"


def test_a_park_seals_an_open_tool_call_interrupted_and_leaves_no_call_open(alice: User) -> None:
    run = running_run(alice)
    call = {"call_id": "c1", "name": "slow"}
    services.run_events_append(run_id=run.pk, generation=1, events=[("tool.started", call | {"arguments": {}})])
    assert services.run_pause(run_id=run.pk).pending

    parked = services.run_wait(run_id=run.pk, generation=1, reason="paused")

    assert (parked.status, parked.open_tool_calls) == ("waiting", [])
    sealed, waiting = RunEvent.objects.filter(run=run).order_by("seq")[parked.last_seq - 2 :]
    assert (sealed.type, sealed.data, sealed.attempt) == ("tool.finished", call | {"status": "interrupted"}, 1)
    assert (waiting.type, waiting.data) == ("run.waiting", {"reason": "paused", "prompt": None})
    assert parked.events_used == 3  # tool.started, its seal and run.waiting
    # Nothing of the call is open any more: an end later seals nothing.
    services.run_resume(run_id=run.pk, ticket=parked.resume_ticket)
    services.run_cancel(run_id=run.pk, actor=alice)
    assert [e.type for e in assert_log_is_sound(run)].count("tool.finished") == 1


def test_queued_at_is_when_the_run_last_entered_the_queue(alice: User) -> None:
    def entered(run: Run, event_type: str) -> bool:
        stored = Run.objects.get(pk=run.pk)
        last = RunEvent.objects.filter(run=run, type=event_type).order_by("-seq").first()
        return last is not None and stored.queued_at == last.created_at

    run = queued_run(alice)
    assert entered(run, "run.created")
    assert services.run_claim(worker="w") is not None
    services.run_requeue(run_id=run.pk, generation=1, cause="worker_shutdown")
    assert entered(run, "run.requeued")
    assert services.run_claim(worker="w") is not None
    services.run_pause(run_id=run.pk)
    parked = services.run_requeue(run_id=run.pk, generation=2, cause="lease_expired")
    # Requeued, then parked at once for the pending pause: it entered the queue all the same.
    assert parked.status == "waiting" and entered(run, "run.requeued")
    services.run_resume(run_id=run.pk, ticket=parked.resume_ticket)
    assert entered(run, "run.resumed")


# --- requeue ---------------------------------------------------------------------------------


def test_a_clean_shutdown_requeues_without_counting_a_lost_attempt(alice: User) -> None:
    run = running_run(alice, max_attempts=1)
    requeued = services.run_requeue(run_id=run.pk, generation=1, cause="worker_shutdown")
    assert (requeued.status, requeued.lost_attempts) == ("queued", 0)
    attempt = RunAttempt.objects.get(run=run)
    assert attempt.outcome == "shutdown" and attempt.released_at is not None
    event = RunEvent.objects.get(run=run, seq=requeued.last_seq)
    assert (event.type, event.data) == ("run.requeued", {"generation": 1, "cause": "worker_shutdown"})


def test_lost_attempts_requeue_until_max_attempts_then_fail_worker_lost(alice: User) -> None:
    run = running_run(alice, max_attempts=2)
    first = services.run_requeue(run_id=run.pk, generation=1, cause="lease_expired")
    assert (first.status, first.lost_attempts) == ("queued", 1)
    assert RunAttempt.objects.get(run=run, generation=1).outcome == "lost"
    assert services.run_claim(worker="w2") is not None
    final = services.run_requeue(run_id=run.pk, generation=2, cause="lease_expired")
    assert (final.status, final.end_code, final.lost_attempts) == ("failed", "worker_lost", 2)
    assert RunAttempt.objects.get(run=run, generation=2).outcome == "lost"
    assert_log_is_sound(run)


@pytest.mark.parametrize("cause,lost", [("worker_shutdown", 0), ("lease_expired", 1)])
def test_a_pending_pause_parks_a_run_whose_attempt_ended_unfinished_after_its_requeued_event(
    alice: User, cause: str, lost: int
) -> None:
    run = running_run(alice)
    assert services.run_pause(run_id=run.pk).pending
    parked = services.run_requeue(run_id=run.pk, generation=1, cause=cause)
    assert (parked.status, parked.lost_attempts, parked.pause_requested_at) == ("waiting", lost, None)
    assert parked.resume_ticket
    # The log says the attempt ended before it says the run waits.
    requeued, waiting = RunEvent.objects.filter(run=run).order_by("seq")[parked.last_seq - 2 :]
    assert (requeued.type, requeued.data, requeued.attempt) == ("run.requeued", {"generation": 1, "cause": cause}, None)
    assert (waiting.type, waiting.data, waiting.attempt) == ("run.waiting", {"reason": "paused", "prompt": None}, None)
    assert parked.events_used == 1  # run.waiting; run.requeued is the platform's record
    assert services.run_claim(worker="w") is None  # parked, not queued
    resumed = services.run_resume(run_id=run.pk, ticket=parked.resume_ticket)
    assert (resumed.run.status, resumed.changed) == ("queued", True)


# --- cascade ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "end,status,code",
    [
        ("cancel", "cancelled", "parent_cancelled"),
        ("stop", "stopped", "parent_stopped"),
        ("complete", "cancelled", "parent_ended"),
        ("fail", "cancelled", "parent_ended"),
    ],
)
def test_ending_a_run_ends_its_unfinished_descendants(alice: User, end: str, status: str, code: str) -> None:
    parent = running_run(alice)
    child = queued_run(alice, parent_id=parent.pk)
    grandchild = queued_run(alice, parent_id=child.pk)
    services.run_pause(run_id=grandchild.pk)  # a waiting descendant, holding a ticket
    done_child = queued_run(alice, parent_id=parent.pk)
    services.run_cancel(run_id=done_child.pk, actor=alice, note="ended before")

    if end == "cancel":
        services.run_cancel(run_id=parent.pk, actor=alice)
    elif end == "stop":
        services.run_stop(run_id=parent.pk, actor=alice, reason="enough")
    elif end == "complete":
        services.run_complete(run_id=parent.pk, generation=1, output=None)
    else:
        services.run_fail(run_id=parent.pk, generation=1, code=FailCode.AGENT_ERROR, reason="x")

    for run in (child, grandchild):
        run.refresh_from_db()
        assert (run.status, run.end_code, run.ended_by, run.resume_ticket) == (status, code, "system", "")
        assert_log_is_sound(run)
    done_child.refresh_from_db()
    assert (done_child.end_code, done_child.end_reason) == ("cancelled_by_user", "ended before")
    assert_log_is_sound(done_child)


def test_a_running_child_is_ended_and_its_attempt_closed(alice: User) -> None:
    parent = queued_run(alice)
    child = queued_run(alice, parent_id=parent.pk)
    services.run_pause(run_id=parent.pk)  # so the claim below takes the child
    claimed = services.run_claim(worker="w")
    assert claimed is not None and claimed[0].pk == child.pk
    services.run_cancel(run_id=parent.pk, actor=alice)
    child.refresh_from_db()
    assert (child.status, child.end_code) == ("cancelled", "parent_cancelled")
    assert RunAttempt.objects.get(run=child).outcome == "cancelled"


def test_ending_a_child_never_touches_its_parent(alice: User) -> None:
    parent = running_run(alice)
    child = queued_run(alice, parent_id=parent.pk)
    before = parent.last_seq
    services.run_cancel(run_id=child.pk, actor=alice)
    services.run_stop(run_id=queued_run(alice, parent_id=parent.pk).pk, actor=alice, reason="x")
    parent.refresh_from_db()
    assert (parent.status, parent.last_seq) == ("running", before)


# --- database constraints --------------------------------------------------------------------


def test_the_database_refuses_what_must_never_be_stored(alice: User) -> None:
    run = running_run(alice)
    now = timezone.now()
    attempts = [
        lambda: Run.objects.filter(pk=run.pk).update(status="completed"),  # terminal without ended_at
        lambda: Run.objects.filter(pk=run.pk).update(status="stopped", ended_at=now, end_reason="x"),  # no code
        lambda: Run.objects.filter(pk=run.pk).update(status="stopped", ended_at=now, end_code="staff"),  # no reason
        lambda: Run.objects.filter(pk=run.pk).update(ended_at=now),  # live with ended_at
        lambda: Run.objects.filter(pk=run.pk).update(resume_ticket="t"),  # ticket while not waiting
        lambda: RunEvent.objects.create(run=run, seq=1, type="x", created_at=now),  # duplicate seq
        lambda: RunAttempt.objects.create(  # a second attempt of generation 1
            run=run, generation=1, worker="w", claimed_at=now, heartbeat_at=now, lease_expires_at=now
        ),
        lambda: RunAttempt.objects.create(  # a second open attempt
            run=run, generation=2, worker="w", claimed_at=now, heartbeat_at=now, lease_expires_at=now + timedelta(1)
        ),
    ]
    for attempt in attempts:
        with pytest.raises(IntegrityError), transaction.atomic():
            attempt()
    run.refresh_from_db()
    assert run.status == "running"
