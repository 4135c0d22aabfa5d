"""The API's error shape (docs/design/api.md#errors), asserted of a test client's response; test
clients signed in by session or by token; a run's URLs and the keys of its JSON."""

from typing import Any

from django.contrib.auth.models import User
from rest_framework.test import APIClient

from runs.models import Run
from tests.support.db import token_for

# The keys of a run's JSON (docs/design/api.md#run-json).
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
    "schedule",
    "attempt",
}


def api_for(user: User) -> APIClient:
    """An API test client authenticated as `user`."""
    client = APIClient()
    client.force_authenticate(user)
    return client


def assert_error(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    body: dict[str, Any] = response.json()
    assert set(body) <= {"error", "run"}
    assert set(body["error"]) == {"code", "message", "detail"}
    assert body["error"]["code"] == code, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body


def assert_ended(response: Any, status: str, code: str, reason: str, by: str) -> dict[str, Any]:
    """A 200 answering a command with the run it ended: its status, end_code, end_reason and ended_by."""
    assert response.status_code == 200, response.content
    body: dict[str, Any] = response.json()
    assert (body["status"], body["end_code"], body["end_reason"], body["ended_by"]) == (status, code, reason, by)
    return body


def client_with(key: str | None) -> APIClient:
    """An API test client sending `key` as its token (None: anonymous)."""
    client = APIClient()
    if key is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def client_for(user: User | None = None) -> APIClient:
    """A client with a new token of `user` (none: anonymous)."""
    return client_with(token_for(user) if user is not None else None)


def url(run: Run | str, action: str = "") -> str:
    """A run's URL in the API, or one of its actions'."""
    run_id = run.pk if isinstance(run, Run) else run
    return f"/api/runs/{run_id}/" + (f"{action}/" if action else "")


def post_raw(client: APIClient, path: str, body: bytes | str, content_type: str = "application/json") -> Any:
    """A POST of `body` as sent, unencoded by the client."""
    return client.generic("POST", path, body, content_type=content_type)
