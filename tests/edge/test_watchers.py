"""Watchers through the SSE edge (docs/design/edge.md): Debian's Pushpin, started by bin/edge, holds
the streams in front of real uvicorn web processes, which answer with the replay and hold instructions
and publish every committed event themselves; a real worker runs the runs. Watchers get every event
once, in order, and Last-Event-ID resumes exactly."""

import asyncio
from collections.abc import Callable

import pytest
from django.contrib.auth.models import User

from tests.factories import queued_run
from tests.support.db import token_for
from tests.support.edge import (
    control_socket,
    edge_env,
    session_headers,
    stack,
    start_edge,
    wait_leading,
    watched_to_the_end,
)
from tests.support.procs import Procs, connections_to
from tests.support.runs import assert_exact_log
from tests.support.sse import Event, Stream, auth_headers, request_once, stream_path, watch
from tests.support.waiting import wait_until
from tests.support.workers import wait_status

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@pytest.mark.edge
@pytest.mark.processes
def test_watchers_through_the_edge_receive_every_event_once_in_order(
    procs: Procs, alice: User, make_user: Callable[..., User]
) -> None:
    control = control_socket()
    # Each stream's link is fetched (its user re-checked) once a minute here, not in the test.
    web = procs.uvicorn(env=edge_env(control, RUNLEDGER_GRIP_LINK_SECONDS="60"))
    wait_leading(web)
    edge = start_edge(procs, upstream=web, control=control)
    staff = make_user(perms=("runs.view_run",))
    run = queued_run(alice, input={"deltas": 40, "delay_ms": 25})
    # Programs with their token, browsers with their session, and staff who see every run.
    headers = [auth_headers(token_for(alice))] * 10 + [session_headers(alice)] * 10
    headers += [auth_headers(token_for(staff))] * 10

    def idle() -> None:
        # Pushpin holds every watcher: once the connections it opened for their connects have
        # idled out, the web process holds none of theirs.
        wait_until(lambda: connections_to(web.port) <= 2, 20, "the web process idle")

    run = watched_to_the_end(procs, edge, run, headers, once_connected=idle)
    # Each event was published once, not once per watcher.
    assert edge.log().count("POST /publish/") <= run.last_seq


@pytest.mark.edge
@pytest.mark.processes
def test_under_djangos_own_asgi_handler_the_first_stream_request_starts_the_publisher(
    procs: Procs, alice: User
) -> None:
    # No ASGI lifespan there (a host's stock asgi.py): the watchers' connects are its first streams.
    control = control_socket()
    web = procs.uvicorn(env=edge_env(control), app="tests.support.stock_asgi:application")
    edge = start_edge(procs, upstream=web, control=control)
    run = queued_run(alice, input={"deltas": 20, "delay_ms": 20})
    headers = [auth_headers(token_for(alice))] * 3

    watched_to_the_end(procs, edge, run, headers, once_connected=lambda: wait_leading(web))


@pytest.mark.edge
@pytest.mark.processes
def test_last_event_id_through_the_edge_resumes_exactly_and_a_finished_run_read_to_its_end_is_a_204(
    procs: Procs, alice: User
) -> None:
    _web, edge = stack(procs)
    token = token_for(alice)
    run = queued_run(alice, input={"deltas": 30, "delay_ms": 30})

    async def resume_live() -> tuple[list[Event], list[Event]]:
        first = await Stream(edge.url, stream_path(run), auth_headers(token)).open()
        assert first.status == 200
        before: list[Event] = []
        async for event in first.events():
            before.append(event)
            if event.seq >= 8:
                break
        first.abort()
        # What an EventSource does after a drop: the same URL, its last id in the header.
        after = await watch(edge.url, stream_path(run), auth_headers(token, before[-1].id), timeout=60)
        return before, after

    before, after = asyncio.run(asyncio.wait_for(resume_live(), 90))
    run = wait_status(run, "completed")
    assert_exact_log(before + after, run)

    async def read(path: str, last_event_id: str | None) -> list[Event]:
        return await watch(edge.url, path, auth_headers(token, last_event_id), timeout=30)

    # A finished run: Last-Event-ID wins over after_seq, as without the edge, and the stream ends.
    assert_exact_log(asyncio.run(read(f"/api/runs/{run.pk}/stream/?after_seq=3", "11")), run, after=11)
    assert_exact_log(asyncio.run(read(f"/api/runs/{run.pk}/stream/?after_seq=20", None)), run, after=20)
    done = request_once(edge.url, stream_path(run), auth_headers(token, str(run.last_seq)))
    assert (done.status, done.body) == (204, b"")
