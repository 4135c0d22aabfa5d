"""The plain `POST /api/runs/{id}/cancel/` and `POST /api/runs/` answer as their DRF views do
(runs.api.plain, docs/design/api.md#hot-reads): the same status, body and headers, and the same run left behind,
whoever asks (a token, a bad or blocked one, a session, nobody), whatever the run (theirs in any
state, someone else's, none) and whatever the body (none, empty, a note, one the serializer refuses,
one that is no JSON). A request it does not take (a session's, a query string, another Accept, a
refused body) is the DRF view's.

Each request is sent twice through the same middleware, each time to one of two runs made alike: to
the real URL, and to the DRF view mounted beside it (this module's URLconf).
"""

import json
import re
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.utils import timezone

from runs import services
from runs.api.apis import RunCancelApi, RunCollectionApi
from runs.http import throttles
from runs.models import AuthFailure, Run, RunEvent
from runs.selectors.run_json import run_json
from tests.factories import queued_run, running_run, waiting_run
from tests.support.plain import drf_beside, marks, to_both, token

urlpatterns = drf_beside({"runs/<str:run_id>/cancel/": RunCancelApi, "runs/": RunCollectionApi})
pytestmark = marks(__name__)

Make = Callable[[], Any]


def both(
    client: Client,
    make: Make,
    body: Any = "{}",
    *,
    content_type: str = "application/json",
    meta: dict[str, str] | None = None,
    **headers: Any,
) -> Any:
    """The same cancel sent to a run `make` makes, by the plain path, and to another by DRF's; each
    response with its run's id."""

    def send(prefix: str) -> tuple[Any, Any]:
        run = make()
        run_id = run.pk if hasattr(run, "pk") else run
        answer = client.post(f"{prefix}/runs/{run_id}/cancel/", body, content_type, headers=headers, **(meta or {}))
        return answer, run_id

    return to_both(send)


def _alike(content: bytes, run_id: Any) -> Any:
    """The body with what differs between two runs made alike (their ids and times) blanked."""
    text = content.decode().replace(str(run_id), "RUN")
    return json.loads(re.sub(r'"(\d{4}-\d\d-\d\dT[^"]+)"', '"T"', text))


def same(answers: Any, status: int, *, plain: bool = True) -> None:
    (mine, mine_id), (drf, drf_id) = answers
    assert (mine.status_code, drf.status_code) == (status, status), (mine.content, drf.content)
    # Answered by the plain path (DRF's view puts itself in what it renders with), or by DRF.
    assert ("view" in mine.renderer_context) is not plain
    assert "view" in drf.renderer_context
    assert _alike(mine.content, mine_id) == _alike(drf.content, drf_id)
    assert {k: v for k, v in mine.headers.items() if k != "Content-Length"} == {
        k: v for k, v in drf.headers.items() if k != "Content-Length"
    }
    assert _left(mine_id) == _left(drf_id)


def _left(run_id: Any) -> Any:
    """The run as the cancel left it, and its events, without what differs between the two."""
    try:
        run = Run.objects.get(pk=uuid.UUID(str(run_id)))
    except (ValueError, Run.DoesNotExist):
        return None
    events = [(e.seq, e.type, e.data) for e in RunEvent.objects.filter(run=run).order_by("seq")]
    return _alike(json.dumps(run_json(run, ticket=True)).encode(), run_id), events


def test_a_token_cancels_as_drf_answers_in_every_state_with_every_body(
    alice: User, bob: User, make_user: Callable[..., User]
) -> None:
    client = Client()
    key = token(alice)

    def stopped() -> Run:
        run = running_run(alice)
        return services.run_stop(run_id=run.pk, actor=None, reason="over").run

    def cancelled() -> Run:
        run = queued_run(alice)
        return services.run_cancel(run_id=run.pk, actor=alice).run

    for make in (lambda: queued_run(alice), lambda: running_run(alice), lambda: waiting_run(alice), cancelled):
        same(both(client, make, **key), 200)
    # Ended otherwise: a 409 with the run, its ticket's key shown to the owner as by DRF.
    conflict = both(client, stopped, **key)
    same(conflict, 409)
    assert "resume_ticket" in conflict[0][0].json()["run"]
    for body in ("", {}, {"note": "  why  "}, {"note": 7}, {"note": ""}, {"other": 1}):
        same(both(client, lambda: running_run(alice), body, **key), 200)
    # No body, of another type: DRF's {} too.
    octets = {"CONTENT_TYPE": "application/octet-stream"}
    same(both(client, lambda: queued_run(alice), "", meta=octets, **key), 200, plain=False)
    assert both(client, lambda: queued_run(alice), {"note": "  why  "}, **key)[0][0].json()["end_reason"] == "why"
    # Refused bodies are DRF's to answer: 400 on one's own run, 404 on a run one cannot see.
    refused: list[tuple[Any, str]] = [
        ({"note": ["x"]}, "application/json"),
        ({"note": None}, "application/json"),
        ({"note": "x" * 10_001}, "application/json"),
        ("[]", "application/json"),
        ("null", "application/json"),
        ("{not json", "application/json"),
        ('{"note": NaN}', "application/json"),
        ('{"note": "a\\u0000b"}', "application/json"),
    ]
    for body, content_type in refused:
        same(both(client, lambda: queued_run(alice), body, content_type=content_type, **key), 400, plain=False)
        same(both(client, lambda: queued_run(bob), body, content_type=content_type, **key), 404, plain=False)
    same(both(client, lambda: queued_run(alice), "note=x", content_type="text/plain", **key), 415, plain=False)
    same(
        both(client, lambda: queued_run(alice), '{"note": "x"}', content_type="application/json; charset=utf-8", **key),
        200,
        plain=False,
    )
    same(both(client, lambda: queued_run(alice), **key, Accept="text/html"), 406, plain=False)
    # Someone else's run: invisible (404), visible but not theirs to cancel (403), or staff's (200).
    same(both(client, lambda: queued_run(bob), **key), 404)
    viewer = make_user("viewer", perms=("runs.view_run",))
    same(both(client, lambda: queued_run(alice), **token(viewer)), 403)
    staff = make_user("staff", perms=("runs.view_run", "runs.cancel_run"))
    staffs = both(client, lambda: queued_run(alice), **token(staff))
    same(staffs, 200)
    assert staffs[0][0].json()["end_code"] == "cancelled_by_staff"
    for missing in ("00000000-0000-0000-0000-000000000007", "not-a-run"):
        same(both(client, lambda missing=missing: missing, **key), 404)
    inactive = make_user("gone")
    gone = token(inactive)
    inactive.is_active = False
    inactive.save()
    same(both(client, lambda: queued_run(alice), **gone), 401)


def test_a_query_string_goes_to_drf_and_bad_tokens_and_a_blocked_address_are_refused_alike(alice: User) -> None:
    client = Client()
    mine = [queued_run(alice), queued_run(alice)]
    answers = [
        client.post(f"{prefix}/runs/{run.pk}/cancel/?format=json", "{}", "application/json", headers=token(alice))
        for prefix, run in zip(("/api", "/drf"), mine, strict=True)
    ]
    same(list(zip(answers, (run.pk for run in mine), strict=True)), 200, plain=False)
    same(both(client, lambda: queued_run(alice)), 401, plain=False)  # nobody: DRF's
    for header in ("Token rl_nope", "Token", "Token a b", "Bearer x"):
        before = AuthFailure.objects.count()
        plain = not header.startswith("Bearer") and header != "Token"
        same(both(client, lambda: queued_run(alice), Authorization=header), 401, plain=plain)
        # Each counted as DRF counts it: one failure a bad token attempt, none for another scheme.
        assert AuthFailure.objects.count() - before == (0 if header.startswith("Bearer") else 2)
    with override_settings(RUNLEDGER_AUTH_FAILURES_MAX=3):
        address = throttles._key("token-address", "127.0.0.1")
        now = timezone.now()
        AuthFailure.objects.bulk_create([AuthFailure(key=address, failed_at=now) for _ in range(3)])
        (mine_answer, mine_id), (drf_answer, drf_id) = both(client, lambda: queued_run(alice), **token(alice))
        assert (mine_answer.status_code, drf_answer.status_code) == (429, 429)
        assert "view" not in mine_answer.renderer_context and "view" in drf_answer.renderer_context
        assert abs(int(mine_answer["Retry-After"]) - int(drf_answer["Retry-After"])) <= 1
        assert _left(mine_id) == _left(drf_id)  # neither cancelled
        AuthFailure.objects.filter(failed_at__gte=now - timedelta(seconds=1)).delete()


def test_a_session_cancels_through_drf_with_its_csrf_check(alice: User) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    refused = both(client, lambda: queued_run(alice))
    same(refused, 403, plain=False)
    assert "CSRF" in refused[0][0].json()["error"]["message"]
    allowed = Client()
    allowed.force_login(alice)
    same(both(allowed, lambda: queued_run(alice)), 200, plain=False)


def created(client: Client, body: Any, *, content_type: str = "application/json", **headers: Any) -> Any:
    """The same create sent by the plain path and by DRF's; each response with its run's id (None
    for none made)."""
    answers = []
    for prefix in ("/api", "/drf"):
        sent = body if isinstance(body, str) else json.dumps(body)
        response = client.post(f"{prefix}/runs/", sent, content_type, headers=headers)
        made = response.json().get("id") if response.status_code == 201 else None
        answers.append((response, made))
    return answers


def test_a_token_creates_as_drf_answers_with_every_body_key_and_limit(alice: User, bob: User, settings: Any) -> None:
    client = Client()
    key = token(alice)
    parent = queued_run(alice)
    for body in (
        {"agent": "demo", "input": {}},
        {
            "agent": "demo",
            "input": {"deltas": 2},
            "metadata": {"team": "a"},
            "priority": 5,
            "max_steps": 3,
            "max_events": 50,
            "max_attempts": 2,
            "parent": str(parent.pk),
            "other": 1,
            "start_after": (timezone.now() + timedelta(hours=1)).isoformat(),
            "deadline": "2099-01-01T00:00:00Z",
        },
    ):
        same(created(client, body, **key), 201)

    # With a key: made once, then replayed (the header says so), each path its own key.
    def keyed(n: int) -> list[Any]:
        body = {"agent": "demo", "input": {"n": n}}
        return [
            client.post(f"{prefix}/runs/", body, "application/json", headers={**key, "Idempotency-Key": f"k-{prefix}"})
            for prefix in ("/api", "/drf")
        ]

    for replayed in (False, True):
        mine, drf = keyed(1)
        assert ("Idempotent-Replayed" in mine.headers, "Idempotent-Replayed" in drf.headers) == (replayed, replayed)
        same([(mine, mine.json()["id"]), (drf, drf.json()["id"])], 201)
    mine, drf = keyed(2)
    same([(mine, "k-/api"), (drf, "k-/drf")], 422)
    # What the service or the header refuses after a valid body is the plain path's too; a refused
    # body is DRF's, as are a session's and another Accept.
    same(created(client, {"agent": "nobody", "input": {}}, **key), 400)
    same(created(client, {"agent": "demo", "input": {}, "parent": str(queued_run(bob).pk)}, **key), 400)
    same(created(client, {"agent": "demo", "input": {}}, **key, **{"Idempotency-Key": "a key"}), 400)
    for refused in ({"agent": "demo"}, {"agent": "demo", "input": []}, "{not json", '{"agent": "a\\u0000"}'):
        same(created(client, refused, **key), 400, plain=False)
    same(created(client, {"agent": "demo", "input": {}}, **key, Accept="text/html"), 406, plain=False)
    session = Client()
    session.force_login(alice)
    same(created(session, {"agent": "demo", "input": {}}), 201, plain=False)
    settings.RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER = Run.objects.filter(owner=alice).exclude(status="cancelled").count()
    limited = created(client, {"agent": "demo", "input": {}}, **key)
    assert [response.status_code for response, _ in limited] == [429, 429]
    assert "view" not in limited[0][0].renderer_context and "view" in limited[1][0].renderer_context
    assert limited[0][0].json() == limited[1][0].json()
    assert limited[0][0]["Retry-After"] == limited[1][0]["Retry-After"]
