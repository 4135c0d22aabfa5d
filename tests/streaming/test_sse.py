"""The SSE contract of docs/design/streaming.md against a real uvicorn process, over real sockets.

One uvicorn serves the whole module (it reads the test database afresh on every request); each
test makes its own users and runs. The resilience proofs (random drops, many watchers, several
processes) are in test_sse_resilience.py.
"""

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from runs import services
from runs.events import EventType
from runs.models import Run, RunEvent
from tests.factories import running_run
from tests.support.db import token_for
from tests.support.procs import Proc, Procs, subprocess_env
from tests.support.runs import chosen_seqs, mixed_run
from tests.support.sse import Event, Stream, auth_headers, request_once
from tests.support.threads import in_thread

pytestmark = [pytest.mark.sqlite, pytest.mark.processes, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def web(django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    registry = Procs(Path(tmp_path_factory.mktemp("sse-web")))
    try:
        with django_db_blocker.unblock():
            env = subprocess_env()
        yield registry.uvicorn(env=env)
    finally:
        registry.stop_all()


def path(run: Run | str, query: str = "") -> str:
    run_id = run.pk if isinstance(run, Run) else run
    return f"/api/runs/{run_id}/stream/" + (f"?{query}" if query else "")


def get(web: Proc, url: str, headers: dict[str, str], method: str = "GET") -> Stream:
    return request_once(web.url, url, headers, method)


def append(run: Run, n: int, start: int = 0) -> None:
    services.run_events_append(
        run_id=run.pk, generation=run.generation, events=[("output.delta", {"text": f"d{start + i}"}) for i in range(n)]
    )


def stored(run: Run) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run=run).order_by("seq"))


def assert_frames_are_the_stored_events(events: list[Event], run: Run, after: int = 0) -> None:
    rows = [e for e in stored(run) if e.seq > after]
    assert [e.id for e in events] == [str(r.seq) for r in rows]
    assert [e.event for e in events] == [r.type for r in rows]
    # The data is RunEvent.as_dict() as compact JSON, byte for byte.
    assert [e.data for e in events] == [json.dumps(r.as_dict(), separators=(",", ":")) for r in rows]


def test_stream_replays_stored_events_then_follows_live_ones_until_the_terminal_event(web: Proc, alice: User) -> None:
    token = token_for(alice)
    run = running_run(alice)
    append(run, 3)  # seq 1 run.created, 2 run.started, 3..5 output.delta

    async def scenario() -> tuple[Stream, list[Event]]:
        stream = await Stream(web.url, path(run, "after_seq=0"), auth_headers(token)).open()
        got: list[Event] = []
        async for event in stream.events():
            got.append(event)
            if event.seq == 5:  # replay done: what follows can only come from the live path
                await asyncio.to_thread(in_thread(lambda: append(run, 4, start=3)))
            if event.seq == 9:
                await asyncio.to_thread(
                    in_thread(lambda: services.run_complete(run_id=run.pk, generation=run.generation, output="ok"))
                )
        return stream, got

    stream, events = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert stream.status == 200
    assert stream.headers["content-type"] == "text/event-stream"
    assert stream.headers["cache-control"] == "no-cache"
    assert stream.headers["x-accel-buffering"] == "no"
    assert stream.parser.retry == 2000
    run.refresh_from_db()
    assert run.status == "completed"
    assert_frames_are_the_stored_events(events, run)
    assert events[-1].event == "run.completed"  # and the server ended the stream after it

    # Reconnecting to the finished run with its last id: 204, so EventSource stops retrying.
    done = get(web, path(run, "after_seq=0"), auth_headers(token, last_event_id=str(run.last_seq)))
    assert done.status == 204
    assert done.body == b""


def test_a_stream_of_chosen_types_sends_only_them_and_the_end_and_resumes_exactly(web: Proc, alice: User) -> None:
    token = token_for(alice)
    run = mixed_run(alice, complete=False)
    started = EventType.TOOL_STARTED
    last_replayed = chosen_seqs(run, started)[-1]
    later = [(EventType.OUTPUT_DELTA, {"text": "live"}), (started, {"call_id": "live", "name": "t"})]

    async def scenario() -> tuple[list[Event], list[Event]]:
        # Replayed (a watcher reading the table), then live (the shared frames, picked per watcher).
        stream = await Stream(web.url, path(run, f"types={started}"), auth_headers(token)).open()
        got: list[Event] = []
        async for event in stream.events():
            got.append(event)
            if event.seq == last_replayed:
                await asyncio.to_thread(
                    in_thread(
                        lambda: services.run_events_append(run_id=run.pk, generation=run.generation, events=later)
                    )
                )
                await asyncio.to_thread(
                    in_thread(lambda: services.run_complete(run_id=run.pk, generation=run.generation, output="ok"))
                )
        # Resumed by Last-Event-ID from the middle: the rest, once.
        again = await Stream(web.url, path(run, f"types={started}"), auth_headers(token, str(got[2].seq))).open()
        return got, [event async for event in again.events()]

    got, resumed = asyncio.run(asyncio.wait_for(scenario(), 60))
    expected = chosen_seqs(run, started)
    assert [e.seq for e in got] == expected
    assert got[-1].event == EventType.RUN_COMPLETED
    assert [e.seq for e in resumed] == expected[3:]
    # An unknown name: a 400 naming it, before anything is streamed.
    refused = get(web, path(run, "types=nope.*,output.delta"), auth_headers(token))
    assert refused.status == 400 and "nope.*" in refused.json()["error"]["message"]


def test_after_seq_skips_what_the_client_has_and_last_event_id_wins_over_it(web: Proc, alice: User) -> None:
    token = token_for(alice)
    run = running_run(alice)
    append(run, 5)  # seq 3..7
    services.run_complete(run_id=run.pk, generation=run.generation, output=None)  # seq 8

    async def read(query: str, last_event_id: str | None) -> list[Event]:
        stream = await Stream(web.url, path(run, query), auth_headers(token, last_event_id)).open()
        assert stream.status == 200
        return [e async for e in stream.events()]

    run.refresh_from_db()
    assert_frames_are_the_stored_events(asyncio.run(read("after_seq=4", None)), run, after=4)
    assert_frames_are_the_stored_events(asyncio.run(read("after_seq=1", "6")), run, after=6)
    assert_frames_are_the_stored_events(asyncio.run(read("after_seq=7", "2")), run, after=2)
    # A finished run whose cursor is below its end replays and ends; at its end it is a 204.
    assert get(web, path(run, "after_seq=8"), auth_headers(token)).status == 204
    assert get(web, path(run, "after_seq=50"), auth_headers(token)).status == 204


def test_a_new_streams_first_bytes_carry_the_events_after_its_cursor_and_then_it_follows(
    web: Proc, alice: User
) -> None:
    """The opening reads the short backlog with its checks (docs/design/streaming.md#hub-reads):
    the first chunk is the retry line and every event committed after the cursor, not the retry
    line alone, the events a read later; what commits next follows, once each."""
    token = token_for(alice)
    run = running_run(alice)
    append(run, 3)  # seq 3..5

    async def scenario() -> tuple[bytes, list[Event], list[Event]]:
        stream = await Stream(web.url, path(run, "after_seq=1"), auth_headers(token)).open()
        assert stream.status == 200
        chunks = stream.chunks()
        first = await anext(chunks)
        await asyncio.to_thread(in_thread(lambda: append(run, 2, start=3)))  # seq 6, 7
        await asyncio.to_thread(
            in_thread(lambda: services.run_complete(run_id=run.pk, generation=run.generation, output=None))
        )
        opening = list(stream.parser.feed(first))
        return first, opening, opening + [e async for e in stream.events()]

    first, opening, events = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert first.startswith(b"retry: ")
    assert [event.id for event in opening] == ["2", "3", "4", "5"]
    run.refresh_from_db()
    assert_frames_are_the_stored_events(events, run, after=1)


def test_an_idle_stream_sends_comment_heartbeats(web: Proc, alice: User) -> None:
    token = token_for(alice)
    run = running_run(alice)

    async def scenario() -> Stream:
        stream = await Stream(web.url, path(run), auth_headers(token)).open()
        async for _ in stream.chunks():
            stream.parser.feed(_)
            if stream.parser.comments.count("keep-alive") >= 2:
                break
        stream.close()
        return stream

    # RUNLEDGER_SSE_KEEPALIVE_SECONDS is 1 in the test processes.
    stream = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert stream.parser.comments[:2] == ["keep-alive", "keep-alive"]
    assert stream.parser.last_event_id == "2"


@pytest.mark.parametrize(
    ("query", "last_event_id", "field"),
    [
        ("after_seq=-1", None, "after_seq"),
        ("after_seq=abc", None, "after_seq"),
        ("after_seq=1.5", None, "after_seq"),
        ("after_seq=", None, "after_seq"),
        ("after_seq=%2B1", None, "after_seq"),
        ("after_seq=99999999999999999999", None, "after_seq"),
        ("", "abc", "Last-Event-ID"),
        ("", "-1", "Last-Event-ID"),
        ("after_seq=0", "run-1:3", "Last-Event-ID"),
        ("after_seq=x", "1", "after_seq"),  # each cursor given is checked, even the one that loses
    ],
)
def test_malformed_cursors_are_400_json(
    web: Proc, alice: User, query: str, last_event_id: str | None, field: str
) -> None:
    run = running_run(alice)
    answer = get(web, path(run, query), auth_headers(token_for(alice), last_event_id))
    assert answer.status == 400
    assert answer.headers["content-type"] == "application/json"
    error = answer.json()["error"]
    assert error["code"] == "validation_error"
    assert field in error["detail"]


def test_a_cursor_past_the_end_of_a_live_run_is_400(web: Proc, alice: User) -> None:
    token = token_for(alice)
    run = running_run(alice)  # last_seq 2
    for query, last_event_id in (("after_seq=3", None), ("", "3"), ("after_seq=0", "1000")):
        answer = get(web, path(run, query), auth_headers(token, last_event_id))
        assert answer.status == 400, (query, last_event_id)
        assert answer.json()["error"]["code"] == "validation_error"
    # At its end exactly, a live run streams (and waits for more).
    ok = get(web, path(run, "after_seq=2"), auth_headers(token))
    assert ok.status == 200


def test_unknown_runs_and_malformed_ids_are_404_json(web: Proc, alice: User) -> None:
    token = token_for(alice)
    for run_id in ("7f1d2c3b-0000-4000-8000-000000000000", "not-a-uuid", "1"):
        answer = get(web, path(run_id), auth_headers(token))
        assert answer.status == 404, run_id
        assert answer.json()["error"]["code"] == "not_found"


def test_another_users_run_is_404_unless_they_may_view_all_runs(
    web: Proc, alice: User, bob: User, make_user: Callable[..., User]
) -> None:
    run = running_run(alice)
    hidden = get(web, path(run), auth_headers(token_for(bob)))
    assert hidden.status == 404
    assert hidden.json()["error"]["code"] == "not_found"
    viewer = make_user("viewer", perms=("runs.view_run",))
    assert get(web, path(run), auth_headers(token_for(viewer))).status == 200


def test_unauthenticated_and_bad_tokens_are_401_and_a_session_cookie_is_enough(web: Proc, alice: User) -> None:
    run = running_run(alice)
    for headers in ({}, {"Authorization": "Token not-a-real-key"}, {"Authorization": "Token"}):
        answer = get(web, path(run), headers)
        assert answer.status == 401, headers
        assert answer.json()["error"]["code"] == "not_authenticated"
    # Checks run in order: authentication before visibility, so even an unknown run is a 401.
    assert get(web, path("not-a-run"), {}).status == 401

    browser = Client()
    browser.force_login(alice)
    cookie = f"sessionid={browser.cookies['sessionid'].value}"
    assert get(web, path(run), {"Cookie": cookie}).status == 200


def test_the_stream_only_answers_get(web: Proc, alice: User) -> None:
    run = running_run(alice)
    answer = get(web, path(run), auth_headers(token_for(alice)), method="POST")
    assert answer.status == 405
    assert answer.headers["allow"] == "GET"
    assert answer.json()["error"]["code"] == "method_not_allowed"


def test_the_stream_is_in_the_openapi_schema() -> None:
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.settings import patched_settings
    from drf_spectacular.validation import validate_schema

    from runs.api.schema_settings import SCHEMA_SETTINGS

    with patched_settings(SCHEMA_SETTINGS):
        schema = SchemaGenerator().get_schema(request=None, public=True)
    validate_schema(schema)  # still a valid OpenAPI document with the hook's addition
    operation = schema["paths"]["/api/runs/{run_id}/stream/"]["get"]
    params = {(p["in"], p["name"]) for p in operation["parameters"]}
    assert params == {("path", "run_id"), ("query", "after_seq"), ("header", "Last-Event-ID"), ("query", "types")}
    assert set(operation["responses"]) >= {"200", "204", "400", "401", "404"}
    assert "text/event-stream" in operation["responses"]["200"]["content"]
    assert {next(iter(s)) for s in operation["security"]} == {"tokenAuth", "cookieAuth"}
