"""The plain `GET /api/runs/{id}/` and its events' page answer as their DRF views do (runs.api.plain,
docs/design/api.md#hot-reads): the same status, body and headers, whoever asks (a token, a bad or
blocked one, a session, nobody) and whatever the run (theirs in any state, someone else's, none, a
malformed id); a request it does not take (another Accept, a query string, HEAD) is the DRF view's.

Each request is sent twice through the same middleware: to the real URL, and to the DRF view mounted
beside it (this module's URLconf).
"""

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.utils import timezone

from runs import services
from runs.api.apis import RunDetailApi, RunEventsApi
from runs.http import throttles
from runs.models import AuthFailure
from runs.selectors.run_json import run_json
from tests.factories import queued_run, running_run, waiting_run
from tests.support.plain import drf_beside, marks, to_both, token

# The DRF views the plain ones stand in front of, as `as_view` makes them without the plain path.
urlpatterns = drf_beside({"runs/<str:run_id>/": RunDetailApi, "runs/<str:run_id>/events/": RunEventsApi})
pytestmark = marks(__name__)


def both(client: Client, run_id: Any, tail: str = "", **headers: Any) -> tuple[Any, Any]:
    return to_both(lambda prefix: client.get(f"{prefix}/runs/{run_id}/{tail}", headers=headers))


def same(plain: Any, drf: Any, status: int) -> None:
    assert (plain.status_code, drf.status_code) == (status, status), (plain.content, drf.content)
    # Answered by the plain path (DRF's view puts itself in what it renders with), and by DRF; a
    # page of events is written directly either way.
    if hasattr(drf, "renderer_context"):
        assert "view" not in plain.renderer_context and "view" in drf.renderer_context
    assert plain.content == drf.content
    assert dict(plain.headers) == dict(drf.headers)


def test_a_token_reads_runs_as_drf_answers_in_every_state_and_is_refused_others_alike(
    alice: User, bob: User, make_user: Callable[..., User]
) -> None:
    client = Client()
    running = running_run(alice)
    services.run_events_append(
        run_id=running.pk, generation=running.generation, events=[("output.delta", {"text": "part"})]
    )
    ended = services.run_cancel(run_id=running.pk, actor=alice).run
    waiting = waiting_run(alice)
    runs = [queued_run(alice), waiting, ended]
    staff = make_user("staff", perms=("runs.view_run",))
    for run in runs:
        plain, drf = both(client, run.pk, **token(alice))
        same(plain, drf, 200)
        assert plain.json() == run_json(run.__class__.objects.get(pk=run.pk), ticket=True)
        same(*both(client, run.pk, **token(staff)), 200)  # every run, without the ticket
        same(*both(client, run.pk, **token(bob)), 404)
    assert "resume_ticket" in client.get(f"/api/runs/{waiting.pk}/", headers=token(alice)).json()
    assert "resume_ticket" not in client.get(f"/api/runs/{waiting.pk}/", headers=token(staff)).json()
    assert client.get(f"/api/runs/{ended.pk}/", headers=token(alice)).json()["partial_output"] == {"text": "part"}
    for missing in ("00000000-0000-0000-0000-000000000007", "not-a-run", "1" * 40):
        same(*both(client, missing, **token(alice)), 404)
    inactive = make_user("gone")
    key = token(inactive)
    inactive.is_active = False
    inactive.save()
    same(*both(client, runs[0].pk, **key), 401)


def test_bad_tokens_nobody_and_a_blocked_address_are_refused_as_drf_refuses_them(alice: User) -> None:
    client = Client()
    run = queued_run(alice)
    same(*both(client, run.pk), 401)
    for header in ("Token rl_nope", "Token", "Token a b", "Bearer x"):
        before = AuthFailure.objects.count()
        plain, drf = both(client, run.pk, Authorization=header)
        same(plain, drf, 401)
        # Each counted as DRF counts it: one failure a bad token attempt, none for another scheme.
        assert AuthFailure.objects.count() - before == (0 if header.startswith("Bearer") else 2)
    with override_settings(RUNLEDGER_AUTH_FAILURES_MAX=3):
        address = throttles._key("token-address", "127.0.0.1")
        now = timezone.now()
        AuthFailure.objects.bulk_create([AuthFailure(key=address, failed_at=now) for _ in range(3)])
        plain, drf = both(client, run.pk, **token(alice))  # even a valid key, from a blocked address
        assert (plain.status_code, drf.status_code) == (429, 429)
        assert "view" not in plain.renderer_context and "view" in drf.renderer_context
        waits = [int(response["Retry-After"]) for response in (plain, drf)]
        assert abs(waits[0] - waits[1]) <= 1  # the two were sent a moment apart

        def unwaited(response: Any) -> bytes:
            return re.sub(rb"in \d+ s", b"in N s", response.content)

        assert unwaited(plain) == unwaited(drf)
        assert {k: v for k, v in plain.headers.items() if k != "Retry-After"} == {
            k: v for k, v in drf.headers.items() if k != "Retry-After"
        }
        AuthFailure.objects.filter(failed_at__gte=now - timedelta(seconds=1)).delete()


def test_a_session_reads_runs_as_drf_answers(alice: User, bob: User) -> None:
    client = Client()
    client.force_login(alice)
    mine, theirs = queued_run(alice), queued_run(bob)
    same(*both(client, mine.pk), 200)
    same(*both(client, theirs.pk), 404)


def test_a_page_of_events_is_answered_as_drf_answers_it_with_its_parameters(alice: User, bob: User) -> None:
    client = Client()
    run = running_run(alice)
    services.run_events_append(
        run_id=run.pk, generation=run.generation, events=[("output.delta", {"text": str(i)}) for i in range(5)]
    )
    key = token(alice)
    pages = {
        "events/": 200,
        "events/?after_seq=2&limit=2": 200,
        "events/?types=output.delta": 200,
        "events/?limit=0": 400,
        "events/?limit=1&limit=2": 400,
        "events/?after_seq=99": 400,
        "events/?types=nope": 400,
        "events/?ignored=1": 200,
    }
    for tail, status in pages.items():
        same(*both(client, run.pk, tail, **key), status)
    same(*both(client, run.pk, "events/?limit=0", **token(bob)), 404)  # not theirs: before the parameters
    same(*both(client, run.pk, "events/"), 401)
    assert client.get(f"/api/runs/{run.pk}/events/?format=json", headers=key).status_code == 200  # DRF's


def test_a_request_the_plain_path_does_not_take_is_drfs(alice: User) -> None:
    client = Client()
    run = queued_run(alice)
    key = token(alice)
    # A list of types, an indent, a format: DRF's negotiation answers them (406 for XML, indented JSON).
    assert client.get(f"/api/runs/{run.pk}/", headers={**key, "Accept": "application/xml"}).status_code == 406
    indented = client.get(f"/api/runs/{run.pk}/", headers={**key, "Accept": "application/json; indent=2"})
    assert indented.status_code == 200 and indented.content.startswith(b"{\n  ")
    assert client.get(f"/api/runs/{run.pk}/?format=xml", headers=key).status_code == 404
    assert client.head(f"/api/runs/{run.pk}/", headers=key).status_code == 200
    assert client.post(f"/api/runs/{run.pk}/", headers=key).status_code == 405
