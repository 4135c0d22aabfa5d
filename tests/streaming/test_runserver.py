"""`manage.py runserver`, Django's development server, a WSGI server, serves the whole app
(docs/design/streaming.md#servers): a stream arrives event by event as the run makes them and ends
with it; the per-user cap (1 here) holds, and a slot comes back when its stream ends, when its
client leaves, and when a wait answers or cannot; the API, the pages with their static files, the
admin, the Python client and the watch page in a real browser all work against it.

One runserver (`DJANGO_DEBUG=1`, as a developer runs it: it then serves the static files) and one
worker for the module; each test makes its own users and runs.
"""

import asyncio
import re
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from runledger_client import Client
from runs.agents.demo import demo_text
from runs.models import Run
from tests.factories import queued_run
from tests.support.browser import give_password, site_login
from tests.support.db import token_for
from tests.support.procs import Proc, Procs, subprocess_env
from tests.support.signin import CSRF_FIELD
from tests.support.sse import Event, Stream, auth_headers, request_once
from tests.support.waiting import wait_until

if TYPE_CHECKING:
    from playwright.sync_api import ConsoleMessage, Page

pytestmark = [pytest.mark.sqlite, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

PASSWORD = "runserver-pw"


@pytest.fixture(scope="module")
def served(django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """The module's runserver, with a worker beside it."""
    registry = Procs(Path(tmp_path_factory.mktemp("runserver")))
    try:
        with django_db_blocker.unblock():
            env = subprocess_env(
                DJANGO_DEBUG="1", RUNLEDGER_MAX_STREAMS_PER_USER="1", RUNLEDGER_SSE_RECHECK_SECONDS="0.5"
            )
        web = registry.runserver(env=env)
        registry.worker("runserver", concurrency=4, env=env)
        yield web
    finally:
        registry.stop_all()


def api(served: Proc, token: str) -> httpx.Client:
    return httpx.Client(base_url=served.url, headers={"Authorization": f"Token {token}"}, timeout=60)


def stream_path(run_id: object) -> str:
    return f"/api/runs/{run_id}/stream/"


def later_run(owner: User) -> Run:
    """A run that stays queued for the test's whole length: its stream stays open, its wait waits."""
    return queued_run(owner, start_after=timezone.now() + timedelta(hours=1))


def status_of_a_stream(served: Proc, path: str, token: str) -> int:
    """The status of a stream opened and closed at once (its slot, if it took one, given back)."""
    return request_once(served.url, path, auth_headers(token)).status


def test_a_stream_arrives_event_by_event_and_ends_with_its_run(served: Proc, alice: User) -> None:
    token = token_for(alice)
    client = api(served, token)
    created = client.post("/api/runs/", json={"agent": "demo", "input": {"deltas": 4, "delay_ms": 0, "ask": "go?"}})
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]

    async def follow() -> tuple[list[Event], list[Event], Stream]:
        stream = await Stream(served.url, stream_path(run_id), auth_headers(token)).open()
        assert stream.status == 200 and stream.headers["content-type"] == "text/event-stream"
        before: list[Event] = []
        after: list[Event] = []
        async for event in stream.events():
            (after if before and before[-1].event == "run.waiting" else before).append(event)
            if event.event == "run.waiting":
                # The run waits, and will until it is resumed: what came so far came live, not
                # at the run's end. Resumed here, on another thread, as a second client would.
                ticket = await asyncio.to_thread(lambda: client.get(f"/api/runs/{run_id}/").json()["resume_ticket"])
                resumed = await asyncio.to_thread(
                    client.post, f"/api/runs/{run_id}/resume/", json={"ticket": ticket, "input": "yes"}
                )
                assert resumed.status_code == 200, resumed.text
        return before, after, stream

    before, after, stream = asyncio.run(asyncio.wait_for(follow(), 60))
    assert before[-1].event == "run.waiting"
    assert stream.finished  # the server ended the response after the terminal event
    events = before + after
    assert [event.seq for event in events] == list(range(1, len(events) + 1))
    assert events[-1].event == "run.completed"
    output = events[-1].json()["data"]["output"]
    assert output["text"] == demo_text(4) and output["answer"] == "yes"


def test_the_cap_holds_and_a_streams_slot_comes_back_when_its_run_ends(served: Proc, alice: User) -> None:
    token = token_for(alice)
    watched, other = later_run(alice), later_run(alice)

    async def hold_then_end() -> list[Event]:
        first = await Stream(served.url, stream_path(watched.pk), auth_headers(token)).open()
        assert first.status == 200
        events = first.events()
        assert (await anext(events)).event == "run.created"  # the stream follows the run: it holds the slot
        second = await asyncio.to_thread(status_of_a_stream, served, stream_path(other.pk), token)
        assert second == 429  # one process, one guard: the cap counts across runserver's threads
        cancelled = await asyncio.to_thread(
            api(served, token).post, f"/api/runs/{watched.pk}/cancel/", json={"note": "done watching"}
        )
        assert cancelled.status_code == 200, cancelled.text
        rest = [event async for event in events]
        assert first.finished
        return rest

    rest = asyncio.run(asyncio.wait_for(hold_then_end(), 60))
    assert rest[-1].event == "run.cancelled"
    # The slot was given back before the response ended: admitted at once, no waiting.
    assert status_of_a_stream(served, stream_path(other.pk), token) == 200


def test_a_streams_slot_comes_back_when_its_client_leaves(served: Proc, alice: User) -> None:
    token = token_for(alice)
    run = later_run(alice)

    async def leave() -> None:
        stream = await Stream(served.url, stream_path(run.pk), auth_headers(token)).open()
        assert stream.status == 200
        assert (await anext(stream.events())).event == "run.created"
        stream.abort()

    asyncio.run(asyncio.wait_for(leave(), 30))
    # The server learns of it at its next write, a keep-alive at the latest (1 s here).
    wait_until(
        lambda: status_of_a_stream(served, stream_path(run.pk), token) == 200,
        timeout=15,
        what="the slot of a stream whose client left",
        interval=0.2,
    )


def test_the_wait_answers_and_holds_a_slot_until_it_does(served: Proc, alice: User) -> None:
    token = token_for(alice)
    client = api(served, token)
    created = client.post("/api/runs/", json={"agent": "demo", "input": {"deltas": 3, "delay_ms": 100}})
    assert created.status_code == 201, created.text
    ended_id = created.json()["id"]
    ended = client.get(f"/api/runs/{ended_id}/wait/", params={"timeout": 30})
    assert ended.status_code == 200 and ended.headers["content-type"] == "application/json"
    assert ended.json()["wait_result"] == "ended" and ended.json()["status"] == "completed"

    def probe() -> int:
        """A stream of the ended run, read to its end: its slot, if it had one, given back before
        its end came (a slot comes back at once when its stream ends), so probes hold none."""

        async def read() -> int:
            stream = await Stream(served.url, stream_path(ended_id), auth_headers(token)).open()
            if stream.status == 200:
                assert [event.event async for event in stream.events()][-1] == "run.completed"
            return stream.status

        return asyncio.run(asyncio.wait_for(read(), 30))

    waited = later_run(alice)
    answers: list[httpx.Response] = []

    def wait() -> None:
        # A probe may hold the slot for the moment it is read: a 429 then is asked again, as a
        # client would.
        for _ in range(100):
            answer = client.get(f"/api/runs/{waited.pk}/wait/", params={"timeout": 30})
            if answer.status_code != 429:
                break
        answers.append(answer)

    waiting = threading.Thread(target=wait, daemon=True)
    waiting.start()
    wait_until(lambda: probe() == 429, timeout=15, what="the wait taking its slot", interval=0.05)
    # The run it waits on goes: the re-check ends the wait, which can no longer answer. Nothing was
    # sent yet, so it says so, for the client to ask again (and learn of the 404).
    Run.objects.filter(pk=waited.pk).delete()
    waiting.join(timeout=30)
    assert not waiting.is_alive()
    (unanswered,) = answers
    assert unanswered.status_code == 503
    assert unanswered.json()["error"]["code"] == "wait_unanswered"
    assert client.get(f"/api/runs/{waited.pk}/wait/").status_code == 404
    assert probe() == 200


def test_the_api_pages_static_files_and_admin_answer(served: Proc) -> None:
    staff = User.objects.create_superuser("runserver-admin", "a@example.com", PASSWORD)
    give_password(staff, PASSWORD)
    token = token_for(staff)
    client = api(served, token)
    created = client.post("/api/runs/", json={"agent": "demo", "input": {"deltas": 500, "delay_ms": 50}})
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]
    assert client.get("/api/runs/").json()["results"][0]["id"] == run_id
    assert client.get(f"/api/runs/{run_id}/events/").status_code == 200
    assert client.get("/api/schema/").status_code == 200
    cancelled = client.post(f"/api/runs/{run_id}/cancel/", json={"note": "from a runserver test"})
    assert cancelled.status_code == 200, cancelled.text

    with httpx.Client(base_url=served.url, timeout=30) as browser:
        for path in ("/healthz/", "/readyz/"):
            assert browser.get(path).status_code == 200, path
        login = browser.get("/accounts/login/")
        found = CSRF_FIELD.search(login.text)
        assert login.status_code == 200 and found is not None
        signed_in = browser.post(
            "/accounts/login/?next=/runs/",
            data={"csrfmiddlewaretoken": found[1], "username": staff.username, "password": PASSWORD},
        )
        assert signed_in.status_code == 302 and signed_in.headers["location"] == "/runs/", signed_in.text
        pages = ["/runs/", f"/runs/{run_id}/", "/admin/", "/admin/runs/run/", f"/admin/runs/run/{run_id}/change/"]
        pages.append("/admin/runs/dashboard/")
        assets: set[str] = set()
        for path in pages:
            page = browser.get(path)
            assert page.status_code == 200, (path, page.status_code)
            assets |= set(re.findall(r'(?:src|href)="(/static/[^"]+)"', page.text))
        assert {"/static/runs/runledger-client.js", "/static/runs/watch.js", "/static/runs/site.css"} <= assets
        for asset in sorted(assets):
            assert browser.get(asset).status_code == 200, asset


def test_the_python_client_creates_follows_and_waits_for_a_run(served: Proc, alice: User) -> None:
    with Client(served.url, token_for(alice)) as client:
        run = client.runs.create("demo", {"deltas": 5, "delay_ms": 20})
        with client.runs.stream(run.id) as events:
            types = [event.type for event in events]
        assert types[0] == "run.created" and types[-1] == "run.completed"
        assert types.count("output.delta") == 5
        ended = client.runs.wait(run.id, timeout=30)
    assert ended.status == "completed" and ended.output == {"text": demo_text(5), "deltas": 5}


@pytest.mark.browser
def test_the_watch_page_follows_a_run_to_its_end_in_a_browser(served: Proc, browser_page: "Page", alice: User) -> None:
    give_password(alice, PASSWORD)
    failed: list[str] = []

    def console(message: "ConsoleMessage") -> None:
        # The browser asks for /favicon.ico by itself; the standalone site has none (nor any 404
        # of the app's own pages, scripts or streams, which the responses below would name).
        if message.type == "error" and not message.location["url"].endswith("/favicon.ico"):
            failed.append(f"{message.text} ({message.location['url']})")

    browser_page.on("response", lambda response: failed.append(response.url) if response.status >= 400 else None)
    browser_page.on("console", console)
    site_login(browser_page, served.url, "alice", PASSWORD)

    with Client(served.url, token_for(alice)) as client:
        run = client.runs.create("demo", {"deltas": 20, "delay_ms": 100})
    browser_page.goto(f"{served.url}/runs/{run.id}/")
    browser_page.wait_for_function(
        "() => document.getElementById('watch').dataset.status === 'completed'", timeout=30_000
    )
    assert browser_page.locator("#output").text_content() == demo_text(20)
    assert failed == []
