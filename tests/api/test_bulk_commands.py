"""Bulk cancel and stop by filter (docs/design/commands.md#bulk-commands):
`POST /api/runs/cancel/` and `POST /api/runs/stop/`, on PostgreSQL and SQLite. The race with real
worker processes is in tests/api/test_bulk_race.py."""

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from runs import services
from runs.events import EventType
from runs.models import IdempotencyRecord, Run, RunEvent
from tests.factories import assert_log_is_sound, queued_run, running_run
from tests.support.api import api_for, assert_error
from tests.support.many_runs import create_runs

pytestmark = [pytest.mark.sqlite, pytest.mark.django_db]

CUSTOMER = {"customer": "42"}


def cancel(api: APIClient, body: dict[str, Any], key: str | None = None) -> Any:
    headers = {} if key is None else {"HTTP_IDEMPOTENCY_KEY": key}
    return api.post("/api/runs/cancel/", body, format="json", **headers)


def status_of(runs: list[Run]) -> set[str]:
    return set(Run.objects.filter(pk__in=[r.pk for r in runs]).values_list("status", flat=True))


def cancelled_events(runs: list[Run]) -> int:
    return RunEvent.objects.filter(run__in=runs, type=EventType.RUN_CANCELLED).count()


def test_cancel_by_metadata_cancels_each_match_once_and_reports_the_ids(alice: User) -> None:
    ours = create_runs(alice, 12, metadata=CUSTOMER)
    others = create_runs(alice, 8, metadata={"customer": "7"})
    answer = cancel(api_for(alice), {"filter": {"metadata": CUSTOMER}, "max": 12, "note": "incident 9"})
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["matched"] == 12
    assert body["counts"] == {"cancelled": 12, "already_ended": 0, "no_longer_matching": 0, "forbidden": 0, "gone": 0}
    assert set(body["ids"]["cancelled"]) == {str(r.pk) for r in ours}
    assert status_of(ours) == {"cancelled"} and status_of(others) == {"queued"}
    assert cancelled_events(ours) == 12 and cancelled_events(others) == 0
    for run in ours:
        assert_log_is_sound(run)
        run.refresh_from_db()
        assert (run.end_code, run.end_reason, run.ended_by) == ("cancelled_by_user", "incident 9", "alice")


def test_more_matches_than_max_is_a_409_with_the_count_and_nothing_done(alice: User) -> None:
    runs = create_runs(alice, 5, metadata=CUSTOMER)
    answer = cancel(api_for(alice), {"filter": {"metadata": CUSTOMER}, "max": 4})
    body = assert_error(answer, 409, "too_many_matches")
    assert "run" not in body
    assert body["error"]["detail"] == {"count": 5, "max": 4}
    assert status_of(runs) == {"queued"} and cancelled_events(runs) == 0
    # max 0 asks only the count.
    assert (
        assert_error(cancel(api_for(alice), {"filter": {}, "max": 0}), 409, "too_many_matches")["error"]["detail"][
            "count"
        ]
        == 5
    )
    assert cancel(api_for(alice), {"filter": {"agent": "nothing-such"}, "max": 0}).json()["matched"] == 0


def test_already_ended_runs_are_reported_and_not_touched(alice: User) -> None:
    live = create_runs(alice, 2, metadata=CUSTOMER)
    done = create_runs(alice, 2, metadata=CUSTOMER)
    services.run_cancel(run_id=done[0].pk, actor=alice, note="earlier")
    services.run_stop(run_id=done[1].pk, actor=alice, reason="policy")
    before = RunEvent.objects.filter(run__in=done).count()
    body = cancel(api_for(alice), {"filter": {"metadata": CUSTOMER}, "max": 10}).json()
    assert body["counts"]["cancelled"] == 2 and body["counts"]["already_ended"] == 2
    assert set(body["ids"]["already_ended"]) == {str(r.pk) for r in done}
    assert set(body["ids"]["cancelled"]) == {str(r.pk) for r in live}
    assert RunEvent.objects.filter(run__in=done).count() == before
    assert Run.objects.get(pk=done[0].pk).end_reason == "earlier"


def test_filters_combine_as_the_list_s_do(alice: User, agent_named: Callable[..., str]) -> None:
    running = running_run(alice, metadata=CUSTOMER)
    queued = create_runs(alice, 2, metadata=CUSTOMER)
    other = agent_named("other", lambda ctx: None)
    other_agent = services.run_create(owner=alice, agent=other, input={}, metadata=CUSTOMER)
    body = cancel(
        api_for(alice),
        {"filter": {"metadata": CUSTOMER, "status": ["queued"], "agent": "demo"}, "max": 2},
    ).json()
    assert set(body["ids"]["cancelled"]) == {str(r.pk) for r in queued}
    assert status_of([running]) == {"running"} and status_of([other_agent]) == {"queued"}
    # The same filter as the list's query gives the same runs.
    listed = api_for(alice).get("/api/runs/", {"metadata.customer": "42", "status": "running,queued"}).json()
    assert {r["id"] for r in listed["results"]} == {str(running.pk), str(other_agent.pk)}
    body = cancel(api_for(alice), {"filter": {"metadata": CUSTOMER, "status": "queued,running"}, "max": 2}).json()
    assert set(body["ids"]["cancelled"]) == {str(running.pk), str(other_agent.pk)}


def test_a_user_s_bulk_command_never_touches_another_user_s_runs(alice: User, bob: User) -> None:
    alices = create_runs(alice, 3, metadata=CUSTOMER)
    bobs = create_runs(bob, 3, metadata=CUSTOMER)
    body = cancel(api_for(alice), {"filter": {"metadata": CUSTOMER}, "max": 3}).json()
    assert body["matched"] == 3 and set(body["ids"]["cancelled"]) == {str(r.pk) for r in alices}
    assert status_of(bobs) == {"queued"} and cancelled_events(bobs) == 0


def test_runs_seen_but_not_commandable_are_forbidden(alice: User, bob: User, make_user: Callable[..., User]) -> None:
    viewer = make_user("viewer", perms=("runs.view_run",))
    own = create_runs(viewer, 1, metadata=CUSTOMER)
    theirs = create_runs(alice, 1, metadata=CUSTOMER) + create_runs(bob, 1, metadata=CUSTOMER)
    body = cancel(api_for(viewer), {"filter": {"metadata": CUSTOMER}, "max": 3}).json()
    assert body["ids"]["cancelled"] == [str(own[0].pk)]
    assert set(body["ids"]["forbidden"]) == {str(r.pk) for r in theirs}
    assert status_of(theirs) == {"queued"}
    staff = make_user("staff", perms=("runs.view_run", "runs.cancel_run"))
    body = cancel(api_for(staff), {"filter": {"metadata": CUSTOMER}, "max": 3}).json()
    assert body["counts"]["cancelled"] == 2 and body["counts"]["already_ended"] == 1
    assert set(Run.objects.filter(pk__in=[r.pk for r in theirs]).values_list("end_code", flat=True)) == {
        "cancelled_by_staff"
    }


def test_stop_by_filter_needs_the_stop_permission_and_a_reason(alice: User, make_user: Callable[..., User]) -> None:
    runs = create_runs(alice, 2, metadata=CUSTOMER)
    body = api_for(alice).post("/api/runs/stop/", {"filter": {}, "max": 5, "reason": "r"}, format="json").json()
    assert body["counts"]["forbidden"] == 2 and status_of(runs) == {"queued"}
    stopper = make_user("stopper", perms=("runs.view_run", "runs.stop_run"))
    missing = api_for(stopper).post("/api/runs/stop/", {"filter": {}, "max": 5}, format="json")
    assert "reason" in assert_error(missing, 400, "validation_error")["error"]["detail"]
    answer = api_for(stopper).post(
        "/api/runs/stop/",
        {"filter": {"metadata": CUSTOMER}, "max": 5, "reason": "abuse", "code": "policy"},
        format="json",
    )
    assert answer.status_code == 200, answer.content
    assert answer.json()["counts"]["stopped"] == 2
    assert set(Run.objects.filter(pk__in=[r.pk for r in runs]).values_list("status", "end_code", "end_reason")) == {
        ("stopped", "policy", "abuse")
    }


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"filter": {"status": ["queued", "sleeping"]}, "max": 1}, "filter.status"),
        ({"filter": {"status": "queued,"}, "max": 1}, "filter.status"),
        ({"filter": {"end_code": ["nope"]}, "max": 1}, "filter.end_code"),
        ({"filter": {"created_after": "yesterday"}, "max": 1}, "filter.created_after"),
        ({"filter": {"metadata": {"customer": 42}}, "max": 1}, "filter.metadata.customer"),
        ({"filter": {"metadata": {"a[b]": "1"}}, "max": 1}, "filter.metadata.a[b]"),
        ({"filter": {"metadata": "customer=42"}, "max": 1}, "filter.metadata"),
        ({"filter": {"staus": ["queued"]}, "max": 1}, "filter.staus"),
        ({"filter": {"parent": "not-a-uuid"}, "max": 1}, "filter.parent"),
        ({"filter": [], "max": 1}, "filter"),
        ({"filter": {}}, "max"),
        ({"filter": {}, "max": -1}, "max"),
        ({"filter": {}, "max": 1001}, "max"),
        ({"max": 1}, "filter"),
    ],
)
def test_a_malformed_bulk_command_is_a_400_naming_the_field_and_nothing_is_done(
    alice: User, body: dict[str, Any], field: str
) -> None:
    runs = create_runs(alice, 1)
    error = assert_error(cancel(api_for(alice), body), 400, "validation_error")["error"]
    assert field in error["detail"], error
    assert field in error["message"]
    assert status_of(runs) == {"queued"}


def test_a_retry_with_the_same_key_replays_the_first_answer_and_writes_nothing(alice: User) -> None:
    runs = create_runs(alice, 3, metadata=CUSTOMER)
    request = {"filter": {"metadata": CUSTOMER}, "max": 3}
    first = cancel(api_for(alice), request, key="incident-9")
    assert first.status_code == 200 and "Idempotent-Replayed" not in first
    events = RunEvent.objects.count()
    more = create_runs(alice, 1, metadata=CUSTOMER)  # would match now: the replay does not look
    again = cancel(api_for(alice), request, key="incident-9")
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert RunEvent.objects.count() == events + 1  # the new run's run.created only
    assert status_of(more) == {"queued"} and status_of(runs) == {"cancelled"}
    other_body = cancel(api_for(alice), {**request, "max": 4}, key="incident-9")
    assert_error(other_body, 422, "idempotency_mismatch")
    assert status_of(more) == {"queued"}


def test_a_refused_bulk_command_is_not_stored_under_its_key(alice: User) -> None:
    runs = create_runs(alice, 3, metadata=CUSTOMER)
    request = {"filter": {"metadata": CUSTOMER, "status": ["queued"]}, "max": 2}
    assert_error(cancel(api_for(alice), request, key="k1"), 409, "too_many_matches")
    services.run_cancel(run_id=runs[0].pk, actor=alice)
    retry = cancel(api_for(alice), request, key="k1")
    assert retry.status_code == 200 and "Idempotent-Replayed" not in retry
    assert retry.json()["counts"]["cancelled"] == 2


def test_keys_are_scoped_to_their_endpoint(alice: User) -> None:
    api = api_for(alice)
    created = api.post("/api/runs/", {"agent": "demo", "input": {}}, format="json", HTTP_IDEMPOTENCY_KEY="same")
    assert created.status_code == 201
    cancelled = cancel(api, {"filter": {}, "max": 1}, key="same")
    assert cancelled.status_code == 200 and "Idempotent-Replayed" not in cancelled
    assert cancelled.json()["ids"]["cancelled"] == [created.json()["id"]]
    queued_run(alice)
    stopped = api.post(
        "/api/runs/stop/", {"filter": {}, "max": 2, "reason": "r"}, format="json", HTTP_IDEMPOTENCY_KEY="same"
    )
    assert stopped.status_code == 200 and "Idempotent-Replayed" not in stopped
    # A key too long to store with its scope is stored hashed, and replays all the same.
    long_key = "k" * 255
    first = cancel(api, {"filter": {"status": ["queued"]}, "max": 1}, key=long_key)
    assert first.status_code == 200
    assert cancel(api, {"filter": {"status": ["queued"]}, "max": 1}, key=long_key)["Idempotent-Replayed"] == "true"
    assert IdempotencyRecord.objects.filter(user=alice).count() == 4


def test_a_run_whose_status_left_the_filter_is_left_alone(alice: User) -> None:
    runs = create_runs(alice, 2, metadata=CUSTOMER)
    started = services.run_claim(worker="w")
    assert started is not None and started[0].pk == runs[0].pk
    # The match is made first; the claim comes between it and the run's lock, as a worker's would.
    matched = Run.objects.filter(pk__in=[r.pk for r in runs])
    result = services.runs_cancel_matching(runs=matched, actor=alice, max_runs=2, statuses=["queued"])
    assert result.ids == {services.Outcome.NO_LONGER_MATCHING: [runs[0].pk], services.Outcome.DONE: [runs[1].pk]}
    assert status_of(runs[:1]) == {"running"}
