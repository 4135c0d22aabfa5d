"""The REST API (docs/design/commands.md, docs/design/api.md), through real HTTP handling (DRF's
test client), token auth and the database. Races use real threads (tests.conftest.race) with
transaction=True."""

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from runs import services
from runs.exceptions import RunConflict
from runs.models import IdempotencyRecord, Run, RunEvent
from tests.conftest import ON_SQLITE
from tests.factories import assert_log_is_sound, queued_run, running_run, waiting_run
from tests.support.api import assert_error
from tests.support.db import token_for
from tests.support.runs import event_types
from tests.support.threads import race

pytestmark = pytest.mark.sqlite

RUN_KEYS = {
    "id",
    "agent",
    "input",
    "metadata",
    "owner",
    "status",
    "created_at",
    "started_at",
    "ended_at",
    "end_code",
    "end_reason",
    "ended_by",
    "output",
    "partial_output",
    "usage",
    "error",
    "last_seq",
    "max_steps",
    "steps_used",
    "max_events",
    "events_used",
    "deadline",
    "priority",
    "start_after",
    "max_attempts",
    "lost_attempts",
    "parent",
    "rerun_of",
    "attempt",
}


def client_with(key: str | None) -> APIClient:
    client = APIClient()
    if key is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def client_for(user: User | None = None) -> APIClient:
    """A client with a new token of `user` (none: anonymous)."""
    return client_with(token_for(user) if user is not None else None)


@pytest.fixture
def api(alice: User) -> APIClient:
    return client_for(alice)


def url(run: Run | str, action: str = "") -> str:
    run_id = run.pk if isinstance(run, Run) else run
    return f"/api/runs/{run_id}/" + (f"{action}/" if action else "")


def post_raw(client: APIClient, path: str, body: bytes | str, content_type: str = "application/json") -> Any:
    return client.generic("POST", path, body, content_type=content_type)


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


# --- authentication and access --------------------------------------------------------------

ENDPOINTS = [
    ("get", "/api/runs/"),
    ("post", "/api/runs/"),
    ("get", "/api/runs/{id}/"),
    ("get", "/api/runs/{id}/events/"),
    ("post", "/api/runs/{id}/cancel/"),
    ("post", "/api/runs/{id}/stop/"),
    ("post", "/api/runs/{id}/pause/"),
    ("post", "/api/runs/{id}/resume/"),
]


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_every_endpoint_needs_authentication_401(alice: User, method: str, path: str) -> None:
    run = queued_run(alice)
    target = path.format(id=run.pk)
    response = getattr(client_for(None), method)(target, {}, format="json")
    assert_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"] == "Token"
    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    assert_error(getattr(bad, method)(target, {}, format="json"), 401, "not_authenticated")
    run.refresh_from_db()
    assert run.status == "queued" and Run.objects.count() == 1


@pytest.mark.parametrize(("method", "path"), ENDPOINTS[2:])
def test_another_users_run_is_404_never_403(
    alice: User, make_user: Callable[..., User], method: str, path: str
) -> None:
    run = waiting_run(alice)
    # Even a holder of the acting permissions cannot act on a run they cannot see. (runs.change_run
    # is not one of them here: with it comes seeing every run, as in the console,
    # docs/design/api.md#access.)
    mallory = make_user("mallory", perms=("runs.cancel_run", "runs.stop_run"))
    body = {"reason": "x", "ticket": run.resume_ticket}
    response = getattr(client_for(mallory), method)(path.format(id=run.pk), body, format="json")
    assert_error(response, 404, "not_found")
    run.refresh_from_db()
    assert run.status == "waiting"


@pytest.mark.parametrize("bad_id", ["not-a-uuid", "12345", "00000000-0000-0000-0000-000000000000", "%20", "%00"])
@pytest.mark.parametrize("action", ["", "events", "cancel", "stop", "pause", "resume"])
def test_a_malformed_or_unknown_run_id_is_404(api: APIClient, bad_id: str, action: str) -> None:
    method = api.get if action in ("", "events") else api.post
    assert_error(method(url(bad_id, action), {}, format="json"), 404, "not_found")


@pytest.mark.parametrize("path", ["/api/", "/api/nope/", "/api/runs", "/api/runs/x/y/z/", "/api/runs/x/cancel"])
def test_unknown_api_urls_are_json_404(api: APIClient, path: str) -> None:
    assert_error(api.get(path), 404, "not_found")
    assert_error(api.post(path, {}, format="json"), 404, "not_found")


def test_a_method_an_endpoint_does_not_have_is_405_in_the_error_shape(api: APIClient, alice: User) -> None:
    run = queued_run(alice)
    assert_error(api.delete(url(run)), 405, "method_not_allowed")
    assert_error(api.get(url(run, "cancel")), 405, "method_not_allowed")


def test_view_run_sees_every_run_but_acts_only_with_the_matching_permission(
    alice: User, make_user: Callable[..., User]
) -> None:
    run = queued_run(alice)
    viewer = client_for(make_user("viewer", perms=("runs.view_run",)))
    response = viewer.get(url(run))
    assert response.status_code == 200
    assert "resume_ticket" not in response.json()
    assert [r["id"] for r in viewer.get("/api/runs/").json()["results"]] == [str(run.pk)]
    for action, body in (("cancel", {}), ("stop", {"reason": "x"}), ("pause", {}), ("resume", {"ticket": "t"})):
        assert_error(viewer.post(url(run, action), body, format="json"), 403, "permission_denied")
    run.refresh_from_db()
    assert run.status == "queued" and event_types(run) == ["run.created"]


def test_the_owner_may_not_stop_without_runs_stop_run_and_403_comes_before_400(api: APIClient, alice: User) -> None:
    run = queued_run(alice)
    assert_error(api.post(url(run, "stop"), {"reason": "mine"}, format="json"), 403, "permission_denied")
    assert_error(api.post(url(run, "stop"), {"code": "bogus"}, format="json"), 403, "permission_denied")
    assert Run.objects.get(pk=run.pk).status == "queued"


def test_cancel_run_permission_cancels_any_visible_run_as_staff(alice: User, make_user: Callable[..., User]) -> None:
    run = queued_run(alice)
    staff = make_user("staffer", perms=("runs.view_run", "runs.cancel_run"))
    response = client_for(staff).post(url(run, "cancel"), {"note": "tidy up"}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["status"], body["end_code"], body["end_reason"], body["ended_by"]) == (
        "cancelled",
        "cancelled_by_staff",
        "tidy up",
        "staffer",
    )
    own = queued_run(staff)
    assert client_for(staff).post(url(own, "cancel"), {}, format="json").json()["end_code"] == "cancelled_by_user"


def test_the_resume_ticket_is_shown_only_to_the_owner_and_change_run(
    alice: User, make_user: Callable[..., User]
) -> None:
    run = waiting_run(alice)
    changer = make_user("changer", perms=("runs.view_run", "runs.change_run"))
    viewer = make_user("viewer", perms=("runs.view_run",))
    assert client_for(alice).get(url(run)).json()["resume_ticket"] == run.resume_ticket
    assert client_for(changer).get(url(run)).json()["resume_ticket"] == run.resume_ticket
    assert "resume_ticket" not in client_for(viewer).get(url(run)).json()
    listed = client_for(viewer).get("/api/runs/").json()["results"]
    assert len(listed) == 1 and "resume_ticket" not in listed[0]


def test_answers_that_may_carry_a_resume_ticket_are_never_stored_by_a_cache(alice: User) -> None:
    run = waiting_run(alice)
    api = client_for(alice)
    answers = {
        "detail": api.get(url(run)),
        "list": api.get("/api/runs/"),
        "pause (no change)": api.post(url(run, "pause")),
        "create": api.post("/api/runs/", {"agent": "demo", "input": {}}, format="json"),
        "a 409 with the run": api.post(url(run, "resume"), {"ticket": "stale"}, format="json"),
    }
    assert answers["detail"].json()["resume_ticket"] == run.resume_ticket
    assert answers["a 409 with the run"].status_code == 409
    for name, response in answers.items():
        assert response["Cache-Control"] == "no-store", name


def test_change_run_alone_sees_every_run_in_the_api_as_in_the_console(
    alice: User, make_user: Callable[..., User]
) -> None:
    run = queued_run(alice)
    changer = make_user("changer", perms=("runs.change_run",), is_staff=True)
    api = client_for(changer)
    assert api.get(url(run)).status_code == 200
    assert [r["id"] for r in api.get("/api/runs/").json()["results"]] == [str(run.pk)]
    assert api.get(url(run, "events")).status_code == 200
    console = Client()
    console.force_login(changer)
    assert console.get(f"/admin/runs/run/{run.pk}/change/").status_code == 200


def test_change_run_pauses_and_resumes_another_users_visible_run(alice: User, make_user: Callable[..., User]) -> None:
    run = queued_run(alice)
    changer = client_for(make_user("changer", perms=("runs.view_run", "runs.change_run")))
    paused = changer.post(url(run, "pause"))
    assert paused.status_code == 200 and paused.json()["status"] == "waiting"
    resumed = changer.post(url(run, "resume"), {"ticket": paused.json()["resume_ticket"]}, format="json")
    assert resumed.status_code == 200 and resumed.json()["status"] == "queued"


def test_session_auth_works_and_a_write_without_the_csrf_token_is_403(alice: User) -> None:
    run = queued_run(alice)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    assert browser.get(url(run)).status_code == 200
    assert_error(browser.post(url(run, "cancel"), "{}", content_type="application/json"), 403, "permission_denied")
    assert Run.objects.get(pk=run.pk).status == "queued"
    # The double-submit a browser page does: the csrftoken cookie's secret, echoed in X-CSRFToken.
    secret = "abcdefghijklmnopqrstuvwxyzABCDEF"
    browser.cookies["csrftoken"] = secret
    response = browser.post(url(run, "cancel"), "{}", content_type="application/json", HTTP_X_CSRFTOKEN=secret)
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "cancelled"


# --- read -----------------------------------------------------------------------------------


def test_a_running_run_shows_its_current_attempt(api: APIClient, alice: User) -> None:
    run = running_run(alice)
    body = api.get(url(run)).json()
    assert body["status"] == "running" and body["started_at"] is not None
    attempt = body["attempt"]
    assert set(attempt) == {
        "generation",
        "worker",
        "claimed_at",
        "heartbeat_at",
        "lease_expires_at",
        "released_at",
        "outcome",
    }
    assert (attempt["generation"], attempt["worker"], attempt["released_at"], attempt["outcome"]) == (
        1,
        "test-worker",
        None,
        None,
    )
    services.run_cancel(run_id=run.pk, actor=alice)
    assert api.get(url(run)).json()["attempt"]["outcome"] == "cancelled"


def test_list_pages_by_cursor_newest_first(api: APIClient, alice: User, bob: User) -> None:
    mine = [queued_run(alice) for _ in range(5)]
    queued_run(bob)
    body = api.get("/api/runs/", {"page_size": 2}).json()
    assert set(body) == {"next", "previous", "results"}
    assert body["previous"] is None and "cursor=" in body["next"]
    assert [r["id"] for r in body["results"]] == [str(r.pk) for r in reversed(mine[-2:])]
    second = api.get(body["next"]).json()
    last = api.get(second["next"]).json()
    assert last["next"] is None and [r["id"] for r in last["results"]] == [str(mine[0].pk)]


def test_list_reads_the_current_attempts_in_constant_queries(
    api: APIClient, alice: User, django_assert_max_num_queries: Any
) -> None:
    running_run(alice)
    api.get("/api/agents/")  # the token's first use is noted (then once a minute): not counted below
    with django_assert_max_num_queries(10) as small:
        api.get("/api/runs/")
    few = len(small.captured_queries)
    for _ in range(6):
        running_run(alice)
    with django_assert_max_num_queries(few) as large:
        body = api.get("/api/runs/").json()
    assert len(large.captured_queries) == few
    assert all(r["attempt"] is not None for r in body["results"])


def test_list_filters_by_status_agent_parent_and_creation_time(api: APIClient, alice: User) -> None:
    running = running_run(alice)
    parent = queued_run(alice)
    child = queued_run(alice, parent_id=parent.pk)
    ids = lambda **q: {r["id"] for r in api.get("/api/runs/", q).json()["results"]}  # noqa: E731
    assert ids(status="running") == {str(running.pk)}
    assert ids(status="queued") == {str(parent.pk), str(child.pk)}
    assert ids(agent="demo") == {str(parent.pk), str(child.pk), str(running.pk)}
    assert ids(agent="other") == set()
    assert ids(parent=str(parent.pk)) == {str(child.pk)}
    assert ids(created_after=parent.created_at.isoformat()) == {str(parent.pk), str(child.pk)}
    assert ids(created_before=parent.created_at.isoformat()) == {str(running.pk)}


@pytest.mark.parametrize(
    "query",
    [
        {"status": "bogus"},
        {"parent": "not-a-uuid"},
        {"created_after": "yesterday"},
        {"created_before": "2024-13-45T00:00:00Z"},
        {"page_size": "0"},
        {"page_size": "ten"},
        {"cursor": "1"},
        {"status": "queued,bogus"},
        {"end_code": "bogus"},
        {"agent": "x" * 65},
        {"agent": "a\x00b"},
    ],
)
def test_malformed_list_filters_are_400(api: APIClient, alice: User, query: dict[str, str]) -> None:
    queued_run(alice)
    body = assert_error(api.get("/api/runs/", query), 400, "validation_error")
    assert set(query) <= set(body["error"]["detail"])


# --- events ---------------------------------------------------------------------------------


def test_events_page_follows_the_cursor_to_the_end_of_the_stream(api: APIClient, alice: User) -> None:
    run = running_run(alice)
    services.run_events_append(
        run_id=run.pk, generation=1, events=[("output.delta", {"text": str(i)}) for i in range(5)]
    )
    first = api.get(url(run, "events"), {"limit": 3}).json()
    assert set(first) == {"results", "next_after_seq", "last_seq", "run_status", "end_of_stream"}
    assert [e["seq"] for e in first["results"]] == [1, 2, 3]
    assert (first["next_after_seq"], first["last_seq"], first["run_status"], first["end_of_stream"]) == (
        3,
        7,
        "running",
        False,
    )
    stored = {e.seq: e.as_dict() for e in RunEvent.objects.filter(run=run)}
    assert first["results"] == [stored[1], stored[2], stored[3]]  # the same object as SSE data
    rest = api.get(url(run, "events"), {"after_seq": 3}).json()
    assert [e["seq"] for e in rest["results"]] == [4, 5, 6, 7] and rest["end_of_stream"] is False
    services.run_complete(run_id=run.pk, generation=1, output={"text": "done"})
    tail = api.get(url(run, "events"), {"after_seq": 7}).json()
    assert [e["type"] for e in tail["results"]] == ["run.completed"]
    assert (tail["next_after_seq"], tail["last_seq"], tail["run_status"], tail["end_of_stream"]) == (
        8,
        8,
        "completed",
        True,
    )
    empty = api.get(url(run, "events"), {"after_seq": 8}).json()
    assert empty["results"] == [] and empty["next_after_seq"] == 8 and empty["end_of_stream"] is True


def test_a_terminal_run_page_short_of_its_last_event_is_not_the_end(api: APIClient, alice: User) -> None:
    run = queued_run(alice)
    services.run_cancel(run_id=run.pk, actor=alice)
    page = api.get(url(run, "events"), {"limit": 1}).json()
    assert page["run_status"] == "cancelled" and page["next_after_seq"] == 1 and page["end_of_stream"] is False


@pytest.mark.parametrize(
    "query",
    [
        {"limit": "1001"},
        {"limit": "0"},
        {"limit": "many"},
        {"after_seq": "-1"},
        {"after_seq": "abc"},
        {"after_seq": "1.0"},
        {"after_seq": " 1"},
        {"after_seq": "2"},
        {"after_seq": "99999999999999999999999"},
    ],
)
def test_malformed_or_out_of_range_event_cursors_are_400(api: APIClient, alice: User, query: dict[str, str]) -> None:
    run = queued_run(alice)  # last_seq 1
    assert_error(api.get(url(run, "events"), query), 400, "validation_error")


def test_events_limit_of_1000_is_allowed(api: APIClient, alice: User) -> None:
    run = queued_run(alice)
    assert api.get(url(run, "events"), {"limit": 1000, "after_seq": 1}).status_code == 200


# --- cancel ---------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [queued_run, running_run, waiting_run])
def test_cancel_ends_a_live_run_and_answers_200_with_it(api: APIClient, alice: User, make: Callable[..., Run]) -> None:
    run = make(alice)
    response = api.post(url(run, "cancel"), {"note": "changed my mind"}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["status"], body["end_code"], body["end_reason"], body["ended_by"]) == (
        "cancelled",
        "cancelled_by_user",
        "changed my mind",
        "alice",
    )
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
    body = stopper.post(url(run, "stop"), {"reason": "maintenance"}, format="json").json()
    assert (body["status"], body["end_code"], body["end_reason"], body["ended_by"]) == (
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


# --- schema and docs ------------------------------------------------------------------------


def test_the_schema_and_docs_are_public_and_document_every_error() -> None:
    anonymous = Client()
    response = anonymous.get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    schema = json.loads(response.content)
    paths = schema["paths"]
    expected = {
        ("/api/runs/", "get"): {"200", "400", "401", "503"},
        ("/api/runs/", "post"): {"201", "400", "401", "409", "413", "415", "422", "429", "503"},
        ("/api/runs/{run_id}/", "get"): {"200", "401", "404", "503"},
        ("/api/runs/{run_id}/events/", "get"): {"200", "400", "401", "404", "503"},
        ("/api/runs/{run_id}/cancel/", "post"): {"200", "400", "401", "403", "404", "409", "413", "415", "503"},
        ("/api/runs/{run_id}/stop/", "post"): {"200", "400", "401", "403", "404", "409", "413", "415", "503"},
        ("/api/runs/{run_id}/pause/", "post"): {"200", "202", "401", "403", "404", "409", "503"},
        ("/api/runs/{run_id}/resume/", "post"): {"200", "400", "401", "403", "404", "409", "413", "415", "429", "503"},
    }
    for (path, method), codes in expected.items():
        documented = paths[path][method]["responses"]
        assert set(documented) == codes, (path, method)
        for code in codes - {"200", "201", "202"}:
            ref = documented[code]["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith("/Conflict" if code == "409" else "/Error")
    assert set(schema["components"]["schemas"]["Error"]["properties"]) == {"error"}
    # What is used of each budget, beside the budget; and the 409 that a full budget answers.
    run_schema = schema["components"]["schemas"]["RunOutput"]
    assert {"steps_used", "events_used", "max_steps", "max_events"} <= set(run_schema["required"])
    assert run_schema["properties"]["events_used"]["type"] == "integer"
    assert "budget_exhausted" in paths["/api/runs/{run_id}/resume/"]["post"]["responses"]["409"]["description"]
    assert {"tokenAuth", "cookieAuth"} <= set(schema["components"]["securitySchemes"])
    # Credentials are not needed, and bad ones are ignored rather than refused.
    assert anonymous.get("/api/schema/", HTTP_AUTHORIZATION="Token nonsense").status_code == 200
    docs = anonymous.get("/api/docs/")
    assert docs.status_code == 200 and b"/api/schema/" in docs.content


def test_health_probes_are_public_json(db: None) -> None:
    for path in ("/healthz/", "/readyz/"):
        response = Client().get(path)
        assert response.status_code == 200 and response.json()["status"] == "ok"
