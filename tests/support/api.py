"""The API's error shape (docs/design/api.md#errors), asserted of a test client's response; a test
client signed in."""

from typing import Any

from django.contrib.auth.models import User
from rest_framework.test import APIClient


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
