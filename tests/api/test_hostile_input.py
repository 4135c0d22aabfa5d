"""A malformed-input sweep over every endpoint: no 5xx, and nothing written.

Each hostile request is sent to every endpoint that takes it; the database's row counts must be
the same afterwards (a bad request loses nothing and adds nothing).
"""

import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from runs.models import IdempotencyRecord, Run, RunAttempt, RunEvent
from tests.factories import running_run, waiting_run
from tests.support.db import token_for

# Committed data: the stream opens its runs on a connection of its own.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite]

BAD_IDS = [
    "abc",
    "00000000-0000-0000-0000-000000000000",
    "0" * 300,
    "%00",
    "..%2F..%2Fetc",
    "%F0%9F%92%A5",
    "%E2%80%AE",
    "1e400",
    "-1",
]

HOSTILE_BODIES: list[bytes] = [
    b"",
    b"null",
    b"[]",
    b'"a string"',
    b"42",
    b"{",
    b'{"agent": "demo", "input": {}',  # truncated
    b'{"agent": "demo", "input": ' + b"[" * 5000 + b"]" * 5000 + b"}",  # deeply nested
    b'{"agent": "demo", "input": ' + b'{"a":' * 3000 + b"1" + b"}" * 3000 + b"}",
    b'{"agent": "demo", "input": {"x": "\\u0000"}}',  # NUL: PostgreSQL cannot store it
    b'{"agent": "demo", "input": {"x": "\\ud800"}}',  # a lone surrogate
    b'{"agent": "demo", "input": {"x": 1e400}}',  # infinity
    b'{"agent": "demo", "input": {"x": NaN}}',
    b'{"agent": "demo", "input": {"x": 123456789012345678901234567890123456789}}',
    b"\xff\xfe\x00garbage",
    b'{"agent": 5, "input": "x"}',
    b'{"agent": "demo", "input": [], "max_steps": "many"}',
    b'{"agent": "demo", "input": {}, "max_steps": 99999999999999999999}',
    b'{"agent": "demo", "input": {}, "max_events": -1, "max_attempts": 0}',
    b'{"agent": "demo", "input": {}, "deadline": "yesterday"}',
    b'{"agent": "demo", "input": {}, "parent": "not-a-uuid"}',
    b'{"agent": "\\u202edemo", "input": {}}',
    b'{"agent": "demo\\u0000", "input": {}}',
    b'{"ticket": null, "input": {}}',
    b'{"ticket": 12345}',
    b'{"ticket": ["x"]}',
    b'{"ticket": "\\u0000"}',
    b'{"ticket": "\\ud83d\\udca5 not the ticket"}',
    b'{"ticket": "' + b"x" * 20000 + b'"}',
    b'{"code": "nonsense", "reason": "x"}',
    b'{"code": "staff", "reason": ""}',
    b'{"code": ["staff"], "reason": {"a": 1}}',
    b'{"note": 12}',
    b'{"note": "' + "\u202e\u0007\U0001f4a5".encode() + b'"}',
    b'{"note": "\\u0000"}',
    b" " * (300 * 1024),  # oversized
    b'{"agent": "demo", "input": {"pad": "' + b"x" * (300 * 1024) + b'"}}',  # oversized and valid
]

CONTENT_TYPES = ["application/json", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]


def counts() -> tuple[int, int, int, int]:
    return (
        Run.objects.count(),
        RunEvent.objects.count(),
        RunAttempt.objects.count(),
        IdempotencyRecord.objects.count(),
    )


@pytest.fixture
def caller(make_user: Callable[..., User]) -> User:
    # Every permission, so that requests reach input validation instead of stopping at 403.
    return make_user("hostile", perms=("runs.view_run", "runs.change_run", "runs.cancel_run", "runs.stop_run"))


@pytest.fixture
def client_for(caller: User) -> Client:
    client = Client(HTTP_AUTHORIZATION=f"Token {token_for(caller)}")
    client.force_login(caller)  # the pages take the session; the API takes the token first
    return client


@pytest.fixture
def targets(caller: User) -> Iterator[dict[str, Run]]:
    yield {"running": running_run(caller), "waiting": waiting_run(caller)}


def api_paths(run_id: str) -> list[str]:
    base = f"/api/runs/{run_id}/"
    return [
        base,
        base + "events/",
        base + "stream/",
        base + "cancel/",
        base + "stop/",
        base + "pause/",
        base + "resume/",
    ]


def assert_sane(response: Any, what: str) -> None:
    assert response.status_code < 500, f"{what}: {response.status_code} {getattr(response, 'content', b'')[:300]!r}"
    if response["Content-Type"].startswith("application/json") and response.status_code >= 400:
        body = json.loads(response.content)
        assert set(body["error"]) == {"code", "message", "detail"}, what


def test_hostile_bodies_to_every_writing_endpoint_are_refused_and_write_nothing(
    client_for: Client, targets: dict[str, Run]
) -> None:
    running, waiting = targets["running"], targets["waiting"]
    paths = ["/api/runs/"] + [
        f"/api/runs/{run.pk}/{action}/"
        for run in (running, waiting)
        for action in ("cancel", "stop", "pause", "resume")
    ]
    writing_ok = 0
    for path, body in itertools.product(paths, HOSTILE_BODIES):
        before = counts()
        response = client_for.post(path, data=body, content_type="application/json")
        what = f"POST {path} {body[:60]!r}"
        assert_sane(response, what)
        if response.status_code >= 400:
            assert counts() == before, what
        else:
            writing_ok += 1  # e.g. a cancel whose body carries no note: a valid command
    # Some of these are valid commands (a cancel with no note); most must have been refused.
    assert writing_ok < len(paths) * len(HOSTILE_BODIES) // 4


@pytest.mark.parametrize("content_type", CONTENT_TYPES)
def test_bodies_of_the_wrong_media_type_are_refused(client_for: Client, content_type: str) -> None:
    before = counts()
    response = client_for.post("/api/runs/", data=b"agent=demo&input=x", content_type=content_type)
    assert_sane(response, content_type)
    assert response.status_code in (400, 415)
    assert counts() == before


def test_bad_ids_in_every_url_are_404_and_write_nothing(client_for: Client) -> None:
    before = counts()
    for bad_id in BAD_IDS:
        for path in api_paths(bad_id):
            method = (
                client_for.get if path.endswith(("/events/", "/stream/")) or path.count("/") == 4 else client_for.post
            )
            response = method(path)
            assert_sane(response, path)
            assert response.status_code == 404, (path, response.status_code)
        response = client_for.get(f"/runs/{bad_id}/")
        assert response.status_code == 404
    assert counts() == before


@pytest.mark.parametrize(
    "query",
    [
        "after_seq=-1",
        "after_seq=abc",
        "after_seq=1e3",
        "after_seq=99999999999999999999999999",
        "after_seq=%00",
        "after_seq=",
        "limit=0",
        "limit=1001",
        "limit=-5",
        "limit=ten",
        "after_seq=1&after_seq=x%F0%9F%92%A5",
    ],
)
def test_hostile_cursors_are_400(client_for: Client, targets: dict[str, Run], query: str) -> None:
    run = targets["running"]
    for suffix in ("events/", "stream/"):
        if suffix == "stream/" and query.startswith("limit"):
            continue
        response = client_for.get(f"/api/runs/{run.pk}/{suffix}?{query}")
        assert_sane(response, query)
        assert response.status_code == 400, (suffix, query, response.status_code)


@pytest.mark.parametrize("last_event_id", ["-1", "abc", "run-1:3", "1.5", " ", "99999999999999999999999999"])
def test_hostile_last_event_ids_are_400(client_for: Client, targets: dict[str, Run], last_event_id: str) -> None:
    run = targets["running"]
    response = client_for.get(f"/api/runs/{run.pk}/stream/", HTTP_LAST_EVENT_ID=last_event_id)
    assert_sane(response, last_event_id)
    assert response.status_code == 400


@pytest.mark.parametrize(
    "query",
    [
        "status=bogus",
        "created_after=yesterday",
        "created_before=2026-13-45",
        "parent=not-a-uuid",
        "status=queued,,running",
        "end_code=bogus",
        "metadata.k=" + "x" * 5000,
        "metadata.a%5Bb%5D=1",
        "metadata.k=a%00b",
        "cursor=abc",
        "cursor=" + "x" * 5000,
        "cursor=WyJuIiwiMjAyNC0wMS0wMVQwMDowMDowMCIsIm5vIl0",
        "page_size=0",
        "page_size=abc",
        "agent=" + "x" * 5000,
    ],
)
def test_hostile_list_filters_are_400(client_for: Client, query: str) -> None:
    response = client_for.get(f"/api/runs/?{query}")
    assert_sane(response, query)
    assert response.status_code == 400


@pytest.mark.parametrize("method", ["put", "patch", "delete"])
def test_wrong_methods_are_405_and_write_nothing(client_for: Client, targets: dict[str, Run], method: str) -> None:
    run = targets["running"]
    before = counts()
    for path in ["/api/runs/", *api_paths(str(run.pk))]:
        response = getattr(client_for, method)(path, data=b"{}", content_type="application/json")
        assert_sane(response, f"{method} {path}")
        assert response.status_code == 405, (method, path, response.status_code)
    # Commands are POST only: a GET on them changes nothing.
    for action in ("cancel", "stop", "pause", "resume"):
        response = client_for.get(f"/api/runs/{run.pk}/{action}/")
        assert response.status_code == 405
    assert counts() == before
    run.refresh_from_db()
    assert run.status == "running"


def test_session_writes_without_the_csrf_token_are_refused(caller: User, targets: dict[str, Run]) -> None:
    run = targets["running"]
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(caller)
    before = counts()
    requests = [("/api/runs/", {"agent": "demo", "input": {}})] + [
        (f"/api/runs/{run.pk}/{action}/", {"code": "staff", "reason": "x"}) for action in ("cancel", "stop", "pause")
    ]
    for path, body in requests:
        response = browser.post(path, data=body, content_type="application/json")
        assert response.status_code == 403, path
        assert json.loads(response.content)["error"]["code"] == "permission_denied"
    # The page's demo form is CSRF-protected too.
    assert browser.post("/runs/", {"deltas": 3, "delay_ms": 0, "children": 0}).status_code == 403
    assert counts() == before
    run.refresh_from_db()
    assert run.status == "running"
