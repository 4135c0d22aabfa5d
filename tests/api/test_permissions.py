"""Who may do what through the API (docs/design/api.md#access, #authentication): every endpoint needs
authentication, another user's run is a 404, each command its permission, the resume ticket shown to
the owner and change_run only, sessions with their CSRF token."""

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from runs.models import Run
from tests.factories import queued_run, waiting_run
from tests.support.api import assert_ended, assert_error, client_for, url
from tests.support.runs import event_types

pytestmark = pytest.mark.sqlite

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
    assert_ended(response, "cancelled", "cancelled_by_staff", "tidy up", "staffer")
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
