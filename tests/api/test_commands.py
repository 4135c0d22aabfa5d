"""The commands through the API (docs/design/commands.md): cancel, stop, pause and resume — their answers,
repeats that write nothing, conflicts with the committed run, and races in real threads
(transaction=True)."""

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from runs import services
from runs.exceptions import RunConflict
from runs.models import Run, RunEvent
from tests.conftest import ON_SQLITE
from tests.factories import assert_log_is_sound, queued_run, running_run, waiting_run
from tests.support.api import RUN_KEYS, assert_ended, assert_error, client_for, client_with, url
from tests.support.db import token_for
from tests.support.runs import event_types
from tests.support.threads import race

pytestmark = pytest.mark.sqlite

# --- cancel ---------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [queued_run, running_run, waiting_run])
def test_cancel_ends_a_live_run_and_answers_200_with_it(api: APIClient, alice: User, make: Callable[..., Run]) -> None:
    run = make(alice)
    response = api.post(url(run, "cancel"), {"note": "changed my mind"}, format="json")
    body = assert_ended(response, "cancelled", "cancelled_by_user", "changed my mind", "alice")
    assert body["ended_at"] is not None and body["resume_ticket"] is None
    assert event_types(run)[-1] == "run.cancelled"


def test_cancel_without_a_body_is_fine(api: APIClient, alice: User) -> None:
    run = queued_run(alice)
    assert api.post(url(run, "cancel")).json()["end_reason"] == ""


def test_n_identical_cancels_write_one_cancelled_event(api: APIClient, alice: User) -> None:
    run = running_run(alice)
    answers = [api.post(url(run, "cancel"), {"note": "stop"}, format="json") for _ in range(5)]
    assert [a.status_code for a in answers] == [200] * 5
    assert all(a.json() == answers[0].json() for a in answers[1:])
    assert event_types(run).count("run.cancelled") == 1
    assert_log_is_sound(run)


@pytest.mark.django_db(transaction=True)
def test_concurrent_identical_cancels_write_one_cancelled_event(alice: User) -> None:
    alice_key = token_for(alice)
    run = running_run(alice)
    answers = race(8, lambda i: client_with(alice_key).post(url(run, "cancel"), {"note": "n"}, format="json"))
    assert [getattr(a, "status_code", a) for a in answers] == [200] * 8
    assert {a.json()["status"] for a in answers} == {"cancelled"}
    assert event_types(run).count("run.cancelled") == 1
    assert_log_is_sound(run)


def test_cancel_of_a_run_that_ended_otherwise_is_409_with_the_committed_run(api: APIClient, alice: User) -> None:
    run = running_run(alice)
    services.run_complete(run_id=run.pk, generation=1, output="done")
    before = event_types(run)
    body = assert_error(api.post(url(run, "cancel"), format="json"), 409, "invalid_transition")
    assert set(body["run"]) == RUN_KEYS | {"resume_ticket"}
    assert body["run"]["status"] == "completed" and body["run"]["output"] == "done"
    assert event_types(run) == before


@pytest.mark.django_db(transaction=True)
def test_cancels_racing_completion_converge_on_the_committed_state(alice: User) -> None:
    alice_key = token_for(alice)
    outcomes = set()
    for _ in range(3 if ON_SQLITE else 6):
        run = running_run(alice)

        def act(i: int, run: Run = run) -> Any:
            if i == 0:
                return services.run_complete(run_id=run.pk, generation=1, output="done")
            return client_with(alice_key).post(url(run, "cancel"), format="json")

        results = race(6, act)
        run.refresh_from_db()
        outcomes.add(run.status)
        answers = results[1:]
        if run.status == "completed":
            assert not isinstance(results[0], BaseException)
            for answer in answers:
                assert answer.status_code == 409, answer.content
                assert answer.json()["error"]["code"] == "invalid_transition"
                assert answer.json()["run"]["status"] == "completed"
        else:
            assert run.status == "cancelled"
            assert isinstance(results[0], RunConflict)
            assert [a.status_code for a in answers] == [200] * 5
        assert_log_is_sound(run)
    assert outcomes <= {"completed", "cancelled"}


# --- stop -----------------------------------------------------------------------------------


@pytest.fixture
def stopper(make_user: Callable[..., User]) -> APIClient:
    return client_for(make_user("stopper", perms=("runs.view_run", "runs.stop_run")))


def test_stop_ends_the_run_with_the_code_and_reason(stopper: APIClient, alice: User) -> None:
    run = running_run(alice)
    assert_ended(
        stopper.post(url(run, "stop"), {"reason": "maintenance"}, format="json"),
        "stopped",
        "staff",
        "maintenance",
        "stopper",
    )
    other = queued_run(alice)
    response = stopper.post(url(other, "stop"), {"code": "policy", "reason": "quota"}, format="json")
    assert response.json()["end_code"] == "policy"


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({}, "reason"),
        ({"reason": ""}, "reason"),
        ({"reason": "   "}, "reason"),
        ({"reason": "x", "code": "parent_stopped"}, "code"),
        ({"reason": "x", "code": "nonsense"}, "code"),
        ({"reason": ["x"]}, "reason"),
    ],
)
def test_stop_refuses_a_missing_reason_or_a_bad_code(
    stopper: APIClient, alice: User, payload: dict[str, Any], field: str
) -> None:
    run = queued_run(alice)
    response = stopper.post(url(run, "stop"), payload, format="json")
    body = assert_error(response, 400, "validation_error")
    assert field in body["error"]["detail"]
    assert Run.objects.get(pk=run.pk).status == "queued"


def test_a_repeated_stop_is_200_and_writes_nothing(stopper: APIClient, alice: User) -> None:
    run = running_run(alice)
    first = stopper.post(url(run, "stop"), {"reason": "r"}, format="json")
    events = event_types(run)
    second = stopper.post(url(run, "stop"), {"reason": "another", "code": "policy"}, format="json")
    assert first.status_code == second.status_code == 200
    assert second.json() == first.json()
    assert event_types(run) == events


def test_stop_of_a_run_that_ended_otherwise_is_409_with_the_run(stopper: APIClient, alice: User) -> None:
    run = queued_run(alice)
    services.run_cancel(run_id=run.pk, actor=alice)
    body = assert_error(stopper.post(url(run, "stop"), {"reason": "r"}, format="json"), 409, "invalid_transition")
    assert body["run"]["status"] == "cancelled"


@pytest.mark.django_db(transaction=True)
def test_a_stop_that_loses_a_race_is_409_with_the_winner(alice: User, make_user: Callable[..., User]) -> None:
    staff = make_user("stopper", perms=("runs.view_run", "runs.stop_run"))
    staff_key, alice_key = token_for(staff), token_for(alice)
    for _ in range(3 if ON_SQLITE else 6):
        run = running_run(alice)

        def act(i: int, run: Run = run) -> Any:
            if i % 2:
                return client_with(staff_key).post(url(run, "stop"), {"reason": "race"}, format="json")
            return client_with(alice_key).post(url(run, "cancel"), format="json")

        answers = race(6, act)
        run.refresh_from_db()
        assert run.status in ("stopped", "cancelled")
        winners = [a for a in answers if a.status_code == 200]
        losers = [a for a in answers if a.status_code == 409]
        assert len(winners) == 3 and len(losers) == 3
        assert {a.json()["status"] for a in winners} == {run.status}
        assert {a.json()["run"]["status"] for a in losers} == {run.status}
        assert_log_is_sound(run)


# --- pause and resume -----------------------------------------------------------------------


def test_pause_of_a_queued_run_parks_it_at_once_200(api: APIClient, alice: User) -> None:
    run = queued_run(alice)
    response = api.post(url(run, "pause"))
    assert response.status_code == 200
    assert response.json()["status"] == "waiting" and response.json()["resume_ticket"]
    assert event_types(run)[-1] == "run.waiting"


def test_pause_of_a_running_run_is_202_and_a_repeat_changes_nothing(api: APIClient, alice: User) -> None:
    run = running_run(alice)
    first = api.post(url(run, "pause"))
    assert first.status_code == 202 and first.json()["status"] == "running"
    run.refresh_from_db()
    requested, events = run.pause_requested_at, event_types(run)
    assert requested is not None
    second = api.post(url(run, "pause"))
    assert second.status_code == 202 and second.json()["status"] == "running"
    run.refresh_from_db()
    assert run.pause_requested_at == requested and event_types(run) == events


def test_pause_of_a_waiting_run_is_200_and_changes_nothing(api: APIClient, alice: User) -> None:
    run = waiting_run(alice)
    response = api.post(url(run, "pause"))
    assert response.status_code == 200 and response.json()["resume_ticket"] == run.resume_ticket
    assert Run.objects.get(pk=run.pk).resume_ticket == run.resume_ticket


def test_pause_of_a_terminal_run_is_409(api: APIClient, alice: User) -> None:
    run = queued_run(alice)
    services.run_cancel(run_id=run.pk, actor=alice)
    body = assert_error(api.post(url(run, "pause")), 409, "invalid_transition")
    assert body["run"]["status"] == "cancelled"


def test_resume_without_a_ticket_is_400(api: APIClient, alice: User) -> None:
    run = waiting_run(alice)
    for payload in ({}, {"ticket": ""}, {"ticket": None}, {"ticket": "tïcket"}, {"ticket": "x" * 300}):
        body = assert_error(api.post(url(run, "resume"), payload, format="json"), 400, "validation_error")
        assert "ticket" in body["error"]["detail"]
    assert Run.objects.get(pk=run.pk).status == "waiting"


def test_resume_with_a_stale_ticket_is_409_and_changes_nothing(api: APIClient, alice: User) -> None:
    run = waiting_run(alice)
    body = assert_error(api.post(url(run, "resume"), {"ticket": "stale"}, format="json"), 409, "stale_ticket")
    assert body["run"]["status"] == "waiting"
    assert event_types(run)[-1] == "run.waiting"
    # A used ticket is stale for any other resume; the same resume again is a safe retry (200).
    assert api.post(url(run, "resume"), {"ticket": run.resume_ticket}, format="json").status_code == 200
    retried = api.post(url(run, "resume"), {"ticket": run.resume_ticket}, format="json")
    assert retried.status_code == 200 and retried.json()["status"] == "queued"
    other = api.post(url(run, "resume"), {"ticket": run.resume_ticket, "input": "other"}, format="json")
    assert assert_error(other, 409, "stale_ticket")["run"]["status"] == "queued"
    assert event_types(run).count("run.resumed") == 1


def test_resume_with_the_ticket_queues_the_run_with_its_input(api: APIClient, alice: User) -> None:
    run = waiting_run(alice)
    response = api.post(url(run, "resume"), {"ticket": run.resume_ticket, "input": {"name": "Ada"}}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "queued" and response.json()["resume_ticket"] is None
    event = RunEvent.objects.filter(run=run).order_by("-seq").first()
    assert event is not None and event.type == "run.resumed" and event.data["input"] == {"name": "Ada"}


def test_pause_then_resume_through_the_api(api: APIClient, alice: User) -> None:
    run = queued_run(alice)
    ticket = api.post(url(run, "pause")).json()["resume_ticket"]
    assert api.post(url(run, "resume"), {"ticket": ticket}, format="json").json()["status"] == "queued"


@pytest.mark.parametrize(("max_events", "refused"), [(5, "resume"), (4, "pause")])
def test_a_pause_resume_loop_stops_at_max_events_with_409_budget_exhausted_and_a_cancel_passes_it(
    api: APIClient, alice: User, max_events: int, refused: str
) -> None:
    run = queued_run(alice, max_events=max_events)
    ticket = None
    for used in range(1, max_events + 1):  # pause, resume, pause, …: one event each
        if ticket is None:
            response = api.post(url(run, "pause"))
            ticket = response.json()["resume_ticket"]
        else:
            response = api.post(url(run, "resume"), {"ticket": ticket}, format="json")
            ticket = None
        assert response.status_code == 200, response.content
        assert (response.json()["events_used"], response.json()["max_events"]) == (used, max_events)
    before = list(RunEvent.objects.filter(run=run).values_list("seq", "type"))

    for _ in range(2):  # refused again, the same way: the refusal changed nothing
        if refused == "pause":
            response = api.post(url(run, "pause"))
        else:
            response = api.post(url(run, "resume"), {"ticket": ticket}, format="json")
        body = assert_error(response, 409, "budget_exhausted")
        assert (body["run"]["status"], body["run"]["events_used"]) == ("waiting" if ticket else "queued", max_events)
        assert body["run"]["resume_ticket"] == ticket
    assert list(RunEvent.objects.filter(run=run).values_list("seq", "type")) == before

    cancelled = api.post(url(run, "cancel"))
    assert cancelled.status_code == 200, cancelled.content
    assert (cancelled.json()["status"], cancelled.json()["events_used"]) == ("cancelled", max_events + 1)
    assert_log_is_sound(run)


def test_a_resume_input_the_agent_refuses_is_400_and_an_oversize_one_413_and_neither_writes(
    api: APIClient, alice: User, settings: Any
) -> None:
    run = waiting_run(alice)
    bad = api.post(url(run, "resume"), {"ticket": run.resume_ticket, "input": {"deltas": -1}}, format="json")
    body = assert_error(bad, 400, "validation_error")
    assert "deltas" in body["error"]["detail"]["input"] and "deltas" in body["error"]["message"]
    pad = "x" * settings.DATA_UPLOAD_MAX_MEMORY_SIZE  # the input alone is over the body's bound
    large = api.post(url(run, "resume"), {"ticket": run.resume_ticket, "input": {"pad": pad}}, format="json")
    assert_error(large, 413, "payload_too_large")
    after = Run.objects.get(pk=run.pk)
    assert (after.status, after.resume_ticket, after.last_seq) == ("waiting", run.resume_ticket, run.last_seq)
