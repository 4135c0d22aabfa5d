"""The middleware of the streams and waits in two hops (runs/http/middleware.py): every answer the
same as Django's own chain gives, method by method — statuses, headers, bodies — for each way a
stream or a wait opens or is refused. Real uvicorn processes: the site's application and Django's own
handler (tests.support.stock_asgi) side by side."""

import asyncio

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client, override_settings

from runs import services
from runs.http.asgi import Application, AsyncViews
from runs.http.middleware import Phased
from tests.factories import queued_run, running_run
from tests.support.db import token_for
from tests.support.procs import Procs
from tests.support.sse import auth_headers, request_once
from tests.support.threads_seen import answer_head, noting_threads

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

# Differ between any two answers, or between the two servers' own ways.
UNCOMPARED = {"date", "server", "set-cookie"}


def _answer(base: str, path: str, headers: dict[str, str], method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    answer = request_once(base, path, headers, method=method)
    kept = {name: value for name, value in answer.headers.items() if name not in UNCOMPARED}
    return answer.status, kept, answer.body


@pytest.mark.processes
def test_streams_and_waits_answer_as_under_djangos_own_middleware_chain(procs: Procs, alice: User, bob: User) -> None:
    phased = procs.uvicorn()
    stock = procs.uvicorn(app="tests.support.stock_asgi:application")
    running, ended, bobs = running_run(alice), running_run(alice), queued_run(bob)
    services.run_cancel(run_id=ended.pk, actor=alice)
    token = auth_headers(token_for(alice))
    browser = Client()
    browser.force_login(alice)
    cookie = {"Cookie": f"sessionid={browser.cookies['sessionid'].value}"}
    cases: list[tuple[str, dict[str, str], str]] = [
        (f"/api/runs/{running.pk}/stream/?after_seq=0", token, "GET"),  # a stream's head
        (f"/api/runs/{running.pk}/stream/?after_seq=0", cookie, "GET"),  # signed in: the session read
        (f"/api/runs/{running.pk}/stream/", {}, "GET"),  # 401
        (f"/api/runs/{bobs.pk}/stream/", token, "GET"),  # 404: not alice's to see
        (f"/api/runs/{ended.pk}/stream/?after_seq=99", token, "GET"),  # 204: read to its end
        (f"/api/runs/{running.pk}/stream/?after_seq=x", token, "GET"),  # 400
        (f"/api/runs/{running.pk}/stream/", token, "POST"),  # 405, CSRF-exempt
        (f"/api/runs/{running.pk}/stream/", cookie, "POST"),  # 405 with a session, no CSRF token
        (f"/api/runs/{ended.pk}/wait/", token, "GET"),  # a wait that answers at once
        (f"/api/runs/{running.pk}/wait/?timeout=x", token, "GET"),  # 400
    ]
    for path, headers, method in cases:
        assert _answer(phased.url, path, headers, method) == _answer(stock.url, path, headers, method), (method, path)
    # The site's own headers came through both (SecurityMiddleware, XFrameOptionsMiddleware).
    status, headers, _ = _answer(phased.url, cases[0][0], token)
    assert status == 200 and headers["x-frame-options"] == "DENY" and headers["x-content-type-options"] == "nosniff"


@pytest.mark.sqlite
def test_a_middleware_that_is_not_a_plain_middleware_mixin_leaves_djangos_own_chain() -> None:
    assert isinstance(AsyncViews()._middleware_chain, Phased)
    with override_settings(MIDDLEWARE=["corsheaders.middleware.CorsMiddleware", *settings.MIDDLEWARE]):
        handler = AsyncViews()
        assert Phased.load(handler) is None
        assert not isinstance(handler._middleware_chain, Phased)


@pytest.mark.sqlite
def test_a_streams_opening_is_one_call_on_an_opening_thread(alice: User) -> None:
    """Django's `request_started`, every `process_request` and every `process_response` of a stream
    run in the one call on the opening threads that runs its checks (runs/http/middleware.py
    `Opening`): for the stream's head and for a refusal alike, where each was a hop of its own."""
    running, ended = running_run(alice), running_run(alice)
    last_seq = services.run_cancel(run_id=ended.pk, actor=alice).run.last_seq
    token = [(b"authorization", f"Token {token_for(alice)}".encode())]
    with override_settings(MIDDLEWARE=[*settings.MIDDLEWARE, "tests.support.threads_seen.ThreadsSeen"]):
        app = Application(None, on_startup=lambda: None, on_shutdown=lambda: asyncio.sleep(0))
        for run, query, status in ((running, b"after_seq=0", 200), (ended, f"after_seq={last_seq}".encode(), 204)):
            with noting_threads() as seen:
                assert asyncio.run(answer_head(app, f"/api/runs/{run.pk}/stream/", query, token)) == status
            steps = [step for step, _ in seen]
            assert steps == ["request_started", "process_request", "process_response"], seen
            threads = {thread for _, thread in seen}
            assert len(threads) == 1 and threads.pop().startswith("runledger-sse-open"), seen
