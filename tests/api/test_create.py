"""Creating runs through the API (docs/design/api.md#create, #idempotency-keys), through real HTTP
handling (DRF's test client), token auth and the database: the answer, bad input refused, parents,
and Idempotency-Key replays, raced in real threads (transaction=True)."""

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.test import APIClient

from runs import services
from runs.models import IdempotencyRecord, Run
from tests.factories import queued_run
from tests.support.api import RUN_KEYS, assert_error, client_for, client_with, post_raw, url
from tests.support.db import token_for
from tests.support.runs import event_types
from tests.support.threads import race

pytestmark = pytest.mark.sqlite

# --- create ---------------------------------------------------------------------------------


def test_create_answers_201_with_the_run_and_stores_it(api: APIClient, alice: User) -> None:
    deadline = timezone.now() + timedelta(hours=1)
    response = api.post(
        "/api/runs/",
        {
            "agent": "demo",
            "input": {"deltas": 2, "nested": {"a": [1, 2.5, None, True]}},
            "max_steps": 10,
            "max_events": 20,
            "max_attempts": 2,
            "deadline": deadline.isoformat(),
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == RUN_KEYS | {"resume_ticket"}
    run = Run.objects.get(pk=body["id"])
    assert run.owner == alice and run.status == "queued"
    assert body["owner"] == "alice"
    assert body["status"] == "queued"
    assert body["input"] == {"deltas": 2, "nested": {"a": [1, 2.5, None, True]}}
    assert (body["max_steps"], body["max_events"], body["max_attempts"]) == (10, 20, 2)
    assert (body["steps_used"], body["events_used"]) == (0, 0)
    assert body["deadline"] is not None and run.deadline == deadline
    assert body["attempt"] is None and body["parent"] is None and body["resume_ticket"] is None
    assert body["last_seq"] == 1 and event_types(run) == ["run.created"]
    assert (body["end_code"], body["end_reason"], body["ended_by"], body["output"], body["error"]) == (
        "",
        "",
        "",
        None,
        None,
    )


def test_create_refuses_an_unknown_agent_with_400_and_writes_nothing(api: APIClient) -> None:
    response = api.post("/api/runs/", {"agent": "no-such-agent", "input": {}}, format="json")
    body = assert_error(response, 400, "validation_error")
    assert "agent" in body["error"]["detail"]
    assert Run.objects.count() == 0


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"input": {}}, "agent"),
        ({"agent": "demo"}, "input"),
        ({"agent": "demo", "input": [1, 2]}, "input"),
        ({"agent": "demo", "input": "text"}, "input"),
        ({"agent": "demo", "input": {}, "max_steps": 0}, "max_steps"),
        ({"agent": "demo", "input": {}, "max_events": -1}, "max_events"),
        ({"agent": "demo", "input": {}, "max_attempts": 10**30}, "max_attempts"),
        ({"agent": "demo", "input": {}, "max_steps": "many"}, "max_steps"),
        ({"agent": "demo", "input": {}, "max_steps": 1.5}, "max_steps"),
        ({"agent": "demo", "input": {}, "max_steps": True}, "max_steps"),
        ({"agent": "demo", "input": {}, "deadline": "tomorrow"}, "deadline"),
        ({"agent": "demo", "input": {}, "parent": "not-a-uuid"}, "parent"),
        ({"agent": 5, "input": {}}, "agent"),
        ({"agent": "x" * 65, "input": {}}, "agent"),
    ],
)
def test_create_refuses_malformed_fields_with_400_naming_the_field(
    api: APIClient, payload: dict[str, Any], field: str
) -> None:
    body = assert_error(api.post("/api/runs/", payload, format="json"), 400, "validation_error")
    assert field in body["error"]["detail"], body
    assert Run.objects.count() == 0


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"[1, 2, 3]",
        b'"a string"',
        b"null",
        b'{"agent": "demo", "input": {"x": NaN}}',
        b'{"agent": "demo", "input": {"x": 1e400}}',
        b'{"agent": "demo", "input": {"x": "\\u0000"}}',
        b'{"agent": "de\\u0000mo", "input": {}}',
        b'{"agent": "demo", "input": {"\\ud800": 1}}',
        b'{"agent": "demo", "input": {"x": "\\udfff"}}',
        b'{"agent": "demo", "input": {"x": "\xff\xfe"}}',
        b'{"agent": "demo", "input": ' + b"[" * 100 + b"]" * 100 + b"}",
        b'{"agent": "demo", "input": ' + b'{"a":' * 20_000 + b"1" + b"}" * 20_000 + b"}",
        b'{"agent": "demo", "input": {"x": ' + b"9" * 5000 + b"}}",
    ],
)
def test_malformed_or_unstorable_json_bodies_are_400_never_500(api: APIClient, raw: bytes) -> None:
    assert_error(post_raw(api, "/api/runs/", raw), 400, "validation_error")
    assert Run.objects.count() == 0


def test_big_but_finite_numbers_and_unicode_in_input_are_stored_as_sent(api: APIClient) -> None:
    sent = {"big": 10**40, "small": -(10**30), "pi": 3.14159, "text": "héllo ✓ 😀", "deep": [[[[["ok"]]]]]}
    response = api.post("/api/runs/", {"agent": "demo", "input": sent}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["input"] == sent
    assert Run.objects.get().input == sent


def test_an_oversized_body_is_413_payload_too_large(api: APIClient, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2048
    body = json.dumps({"agent": "demo", "input": {"blob": "x" * 4096}})
    assert_error(post_raw(api, "/api/runs/", body), 413, "payload_too_large")
    assert Run.objects.count() == 0


def test_the_default_body_limit_is_enforced(api: APIClient, settings: Any) -> None:
    body = json.dumps({"agent": "demo", "input": {"blob": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)}})
    assert_error(post_raw(api, "/api/runs/", body), 413, "payload_too_large")


def test_a_body_that_is_not_json_is_415(api: APIClient) -> None:
    response = post_raw(api, "/api/runs/", "agent=demo", content_type="application/x-www-form-urlencoded")
    assert_error(response, 415, "unsupported_media_type")


def test_create_under_a_visible_parent_links_the_child(api: APIClient, alice: User) -> None:
    parent = queued_run(alice)
    response = api.post("/api/runs/", {"agent": "demo", "input": {}, "parent": str(parent.pk)}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["parent"] == str(parent.pk)
    assert Run.objects.get(pk=response.json()["id"]).parent_id == parent.pk


def test_create_under_an_invisible_or_missing_parent_is_400(api: APIClient, bob: User) -> None:
    bobs = queued_run(bob)
    for parent in (str(bobs.pk), "00000000-0000-0000-0000-000000000000"):
        response = api.post("/api/runs/", {"agent": "demo", "input": {}, "parent": parent}, format="json")
        body = assert_error(response, 400, "validation_error")
        assert "parent" in body["error"]["detail"]
        assert "run" not in body  # nothing about bob's run leaks
    assert Run.objects.count() == 1


def test_only_the_owner_or_change_run_may_use_a_run_as_parent(alice: User, make_user: Callable[..., User]) -> None:
    parent = queued_run(alice)
    viewer = client_for(make_user("viewer", perms=("runs.view_run",)))
    changer = client_for(make_user("changer", perms=("runs.change_run",)))
    body = {"agent": "demo", "input": {}, "parent": str(parent.pk)}
    assert viewer.get(url(parent)).status_code == 200  # seeing it is not enough
    assert_error(viewer.post("/api/runs/", body, format="json"), 400, "validation_error")
    assert changer.post("/api/runs/", body, format="json").status_code == 201
    assert Run.objects.filter(parent=parent).count() == 1


def test_create_under_a_terminal_parent_is_409_with_the_parent_as_run(api: APIClient, alice: User) -> None:
    parent = queued_run(alice)
    services.run_cancel(run_id=parent.pk, actor=alice)
    response = api.post("/api/runs/", {"agent": "demo", "input": {}, "parent": str(parent.pk)}, format="json")
    body = assert_error(response, 409, "invalid_transition")
    assert body["run"]["id"] == str(parent.pk) and body["run"]["status"] == "cancelled"
    assert Run.objects.count() == 1


# --- Idempotency-Key ------------------------------------------------------------------------


def test_a_retry_with_the_same_key_and_body_replays_the_first_response(api: APIClient) -> None:
    payload = {"agent": "demo", "input": {"deltas": 1, "b": [1, 2]}}
    first = api.post("/api/runs/", payload, format="json", HTTP_IDEMPOTENCY_KEY="key-1")
    assert first.status_code == 201
    # The run moves on; the replay still answers the first response, not the current state.
    services.run_pause(run_id=first.json()["id"])
    # Equal as JSON: key order and 1 vs 1.0 do not matter.
    same = {"input": {"b": [1.0, 2], "deltas": 1}, "agent": "demo"}
    second = api.post("/api/runs/", same, format="json", HTTP_IDEMPOTENCY_KEY="key-1")
    assert second.status_code == 201
    assert second.json() == first.json()
    assert second["Idempotent-Replayed"] == "true"
    assert Run.objects.count() == 1
    assert IdempotencyRecord.objects.count() == 1


def test_a_retry_of_a_body_whose_numbers_the_database_rewrote_still_replays(api: APIClient) -> None:
    # PostgreSQL's jsonb stores 1e+308 as a 309-digit integer, which is not exactly the float: the
    # stored body and the retried one are still the same JSON.
    payload = {"agent": "demo", "input": {"big": 1e308, "small": 5e-324, "third": 1 / 3}}
    first = api.post("/api/runs/", payload, format="json", HTTP_IDEMPOTENCY_KEY="key-big")
    assert first.status_code == 201
    second = api.post("/api/runs/", payload, format="json", HTTP_IDEMPOTENCY_KEY="key-big")
    assert second.status_code == 201 and second["Idempotent-Replayed"] == "true"
    assert Run.objects.count() == 1


def test_a_reused_key_with_another_body_is_422_and_creates_nothing(api: APIClient) -> None:
    assert (
        api.post("/api/runs/", {"agent": "demo", "input": {}}, format="json", HTTP_IDEMPOTENCY_KEY="k").status_code
        == 201
    )
    for other in ({"agent": "demo", "input": {"x": 1}}, {"agent": "demo", "input": {}, "max_steps": 3}):
        response = api.post("/api/runs/", other, format="json", HTTP_IDEMPOTENCY_KEY="k")
        assert_error(response, 422, "idempotency_mismatch")
    # true is not 1 as JSON
    api.post("/api/runs/", {"agent": "demo", "input": {"f": 1}}, format="json", HTTP_IDEMPOTENCY_KEY="k2")
    response = api.post("/api/runs/", {"agent": "demo", "input": {"f": True}}, format="json", HTTP_IDEMPOTENCY_KEY="k2")
    assert_error(response, 422, "idempotency_mismatch")
    assert Run.objects.count() == 2


def test_idempotency_keys_are_scoped_to_the_user(alice: User, bob: User) -> None:
    payload = {"agent": "demo", "input": {}}
    a = client_for(alice).post("/api/runs/", payload, format="json", HTTP_IDEMPOTENCY_KEY="shared")
    b = client_for(bob).post("/api/runs/", payload, format="json", HTTP_IDEMPOTENCY_KEY="shared")
    assert a.status_code == b.status_code == 201
    assert a.json()["id"] != b.json()["id"]
    assert b.json()["owner"] == "bob"


def test_a_failed_create_is_not_stored_under_its_key(api: APIClient, alice: User) -> None:
    parent = queued_run(alice)
    services.run_cancel(run_id=parent.pk, actor=alice)
    failing = {"agent": "demo", "input": {}, "parent": str(parent.pk)}
    assert api.post("/api/runs/", failing, format="json", HTTP_IDEMPOTENCY_KEY="k").status_code == 409
    assert (
        api.post("/api/runs/", {"agent": "nope", "input": {}}, format="json", HTTP_IDEMPOTENCY_KEY="k").status_code
        == 400
    )
    response = api.post("/api/runs/", {"agent": "demo", "input": {}}, format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert response.status_code == 201
    assert IdempotencyRecord.objects.get().run_id is not None


def test_an_expired_key_creates_a_new_run(api: APIClient, settings: Any) -> None:
    payload = {"agent": "demo", "input": {}}
    first = api.post("/api/runs/", payload, format="json", HTTP_IDEMPOTENCY_KEY="k")
    settings.RUNLEDGER_IDEMPOTENCY_TTL_SECONDS = 0
    second = api.post("/api/runs/", {"agent": "demo", "input": {"other": 1}}, format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert first.status_code == second.status_code == 201
    assert first.json()["id"] != second.json()["id"]
    assert IdempotencyRecord.objects.get().run_id == Run.objects.get(pk=second.json()["id"]).pk


@pytest.mark.parametrize("key", ["", "x" * 256, "with space", "tab\there"])
def test_a_malformed_idempotency_key_is_400(api: APIClient, key: str) -> None:
    response = api.post("/api/runs/", {"agent": "demo", "input": {}}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert_error(response, 400, "validation_error")
    assert Run.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_concurrent_creates_with_one_key_make_one_run_and_answer_alike(alice: User) -> None:
    alice_key = token_for(alice)
    payload = {"agent": "demo", "input": {"deltas": 1}}
    for attempt in range(3):
        key = f"race-{attempt}"

        def create(i: int, key: str = key) -> Any:
            return client_with(alice_key).post("/api/runs/", payload, format="json", HTTP_IDEMPOTENCY_KEY=key)

        responses = race(4, create)
        assert all(not isinstance(r, BaseException) for r in responses), responses
        assert [r.status_code for r in responses] == [201] * 4
        bodies = [r.json() for r in responses]
        assert all(body == bodies[0] for body in bodies)
        assert sum(1 for r in responses if r.get("Idempotent-Replayed") == "true") == 3
        assert Run.objects.filter(pk=bodies[0]["id"]).count() == 1
    assert Run.objects.count() == 3
