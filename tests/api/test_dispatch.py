"""The app's ASGI wrapper (runs/http/asgi.py, docs/design/deployment.md#web-processes) resolves a
request's path once: it picks the view's handler by the match, and Django's handler takes that
match instead of resolving the path again — for a synchronous view and the stream alike."""

import asyncio
from typing import Any

import pytest
from asgiref.testing import ApplicationCommunicator
from django.conf import settings
from django.contrib.auth.models import User
from django.urls.resolvers import URLResolver

from runs import services
from runs.http.asgi import Application
from tests.factories import queued_run
from tests.support.db import token_for
from tests.support.threads_seen import http_scope

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite, pytest.mark.timeout(30)]


async def _status(app: Application, method: str, path: str, query: bytes, headers: list[tuple[bytes, bytes]]) -> int:
    talk = ApplicationCommunicator(app, http_scope(method, path, query, headers))
    await talk.send_input({"type": "http.request", "body": b"{}" if method == "POST" else b""})
    start = await talk.receive_output(10)
    while (await talk.receive_output(10)).get("more_body"):
        pass
    return int(start["status"])


def test_each_request_resolves_its_path_once(monkeypatch: pytest.MonkeyPatch, alice: User) -> None:
    resolved: list[str] = []
    resolve = URLResolver.resolve

    def counted(self: URLResolver, path: Any) -> Any:
        if self.urlconf_name == settings.ROOT_URLCONF:  # the root's, not an include's within it
            resolved.append(str(path))
        return resolve(self, path)

    monkeypatch.setattr(URLResolver, "resolve", counted)
    app = Application(None, on_startup=lambda: None, on_shutdown=lambda: asyncio.sleep(0))
    token = [(b"authorization", f"Token {token_for(alice)}".encode())]
    run, ended = queued_run(alice), queued_run(alice)
    last_seq = services.run_cancel(run_id=ended.pk, actor=alice).run.last_seq
    requests = [
        ("GET", "/healthz/", b"", [], 200),
        ("GET", f"/api/runs/{run.pk}/", b"", token, 200),  # the plain read
        ("GET", f"/api/runs/{run.pk}/", b"", token, 200),  # its path again
        ("GET", f"/api/runs/{run.pk}/", b"indent=2", token, 200),  # DRF's
        ("POST", f"/api/runs/{run.pk}/cancel/", b"", [*token, (b"content-type", b"application/json")], 200),
        ("GET", f"/api/runs/{ended.pk}/stream/", f"after_seq={last_seq}".encode(), token, 204),  # the async view
        ("GET", "/no/such/path/", b"", [], 404),
    ]
    for method, path, query, headers, status in requests:
        resolved.clear()
        assert asyncio.run(_status(app, method, path, query, headers)) == status, path
        assert resolved == [path], (method, path, query)
