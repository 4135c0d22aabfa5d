"""The SSE edge (docs/design/edge.md): Debian's Pushpin, started by bin/edge, holds the streams in
front of real uvicorn web processes, which answer with the replay and hold instructions and publish
every committed event themselves; a real worker process runs the runs. Every process is started and
stopped by its PID (tests/support/procs.py, tests/support/edge.py).

What is proven: watchers through the edge get every event once, in order; Last-Event-ID resumes
exactly; a lost publish, a killed publisher and a restarted Pushpin leave no gap; a connect
through the edge is checked like any stream; a replayed Grip-Sig, a request that only claims to be
Pushpin's, or a link minted for another run gets nothing; nobody but the web processes' user can
publish; the edge's streams count against the per-user cap, end at their lifetime and when their
user is revoked; and nginx in front of the edge drops half-sent requests before Pushpin sees them.
"""

import asyncio
import base64
import functools
import hashlib
import hmac
import random
import shutil
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import jwt
import pytest
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.db import connection
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext

from runs import services
from runs.conf import conf
from runs.events import EventType
from runs.models import ApiToken, Run
from runs.models_tokens import key_digest
from runs.selectors import run_events_json_after
from runs.selectors.published import runs_events_after_heads
from runs.streaming.edge import grip
from runs.streaming.edge.control import (
    bodies,
    folder_problem,
    parse_tnetstring,
    private_folder,
    socket_path,
    tnetstring,
)
from runs.streaming.edge.link import Link, mint, read
from runs.streaming.edge.publisher import _groups, lock_key
from runs.streaming.hub import make_frame
from tests.factories import queued_run, running_run
from tests.support.db import token_for
from tests.support.edge import (
    Edge,
    PublishTap,
    control_socket,
    edge_env,
    forge_as_nobody,
    listening_tcp_ports,
    real_grip_sig,
    stall_body,
    start_edge,
    wait_leading,
)
from tests.support.faults import Api, Stats, follow
from tests.support.nginx import shared_folder, start_nginx
from tests.support.procs import (
    ROOT,
    Proc,
    Procs,
    connections_to,
    free_port,
    process_gone,
    require_root,
    subprocess_env,
    uvicorn_refusal,
    wait_log_line,
)
from tests.support.proxies import CuttableProxy, SeenRequest
from tests.support.raw_http import request, trickle_headers
from tests.support.runs import assert_exact_log, fresh
from tests.support.seed import SEED
from tests.support.sse import Event, Stream, auth_headers, request_once, stream_path, watch
from tests.support.threads import in_thread
from tests.support.waiting import wait_until
from tests.support.workers import wait_status

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def stack(procs: Procs, *, worker: bool = True, control: str = "", log_level: int = 2, **env: str) -> tuple[Proc, Edge]:
    """A web process behind bin/edge, leading the publishing, and a worker unless told not to
    (tests that claim runs themselves)."""
    control = control or control_socket()
    web = procs.uvicorn(env=edge_env(control, **env))
    wait_leading(web)
    edge = start_edge(procs, upstream=web, control=control, log_level=log_level)
    if worker:
        procs.worker("edge-worker", concurrency=4)
    return web, edge


@contextmanager
def tapped_stack(procs: Procs, log_level: int = 2, **env: str) -> Iterator[tuple[PublishTap, Proc, Edge]]:
    """`stack` without its worker, the publishes going to Pushpin through a tap that can lose or
    refuse them."""
    control = control_socket()
    tap = PublishTap(control).start()
    try:
        yield (
            tap,
            *stack(procs, worker=False, control=control, log_level=log_level, **env, RUNLEDGER_GRIP_URL=tap.url),
        )
    finally:
        tap.stop()


def session_headers(user: User) -> dict[str, str]:
    """What a browser's EventSource sends: the session cookie, no token."""
    browser = Client()
    browser.force_login(user)
    return {"Cookie": f"sessionid={browser.cookies['sessionid'].value}"}


async def watch_all(
    base_url: str, path: str, headers: list[dict[str, str]], *, until: Callable[[list[list[Event]]], bool] | None = None
) -> tuple[list[list[Event]], list[asyncio.Task[list[Event]]]]:
    """Open one stream per headers through `base_url` and wait until each follows the run: the
    events each has received so far (lists that keep filling) and the tasks that end with them."""
    got: list[list[Event]] = [[] for _ in headers]
    connected = [asyncio.Event() for _ in headers]
    tasks = [
        asyncio.create_task(watch(base_url, path, h, connected=c, got=g, timeout=90))
        for h, c, g in zip(headers, connected, got, strict=True)
    ]
    await asyncio.wait_for(asyncio.gather(*(c.wait() for c in connected)), 30)
    return got, tasks


async def until_each_has(got: list[list[Event]], n: int, timeout: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while min(len(g) for g in got) < n:
        assert asyncio.get_running_loop().time() < deadline, [len(g) for g in got]
        await asyncio.sleep(0.02)  # polling the watchers' progress; the deadline above bounds it


async def watch_meanwhile(
    edge: Edge, run: Run, headers: list[dict[str, str]], meanwhile: Callable[[], object]
) -> list[list[Event]]:
    """Watchers of `run` through the edge; once each has 10 events, `meanwhile` (in a thread);
    then every stream to its end."""
    got, tasks = await watch_all(edge.url, stream_path(run), headers)
    await until_each_has(got, 10)
    await asyncio.to_thread(meanwhile)
    return list(await asyncio.wait_for(asyncio.gather(*tasks), 60))


def link_requests(edge: Edge, run: Run) -> list[float]:
    """When (time.time()) Pushpin asked for the run's events itself, by its log."""
    link = f"[handler] GET {edge.url}/api/runs/{run.pk}/stream/link/ "
    return [
        datetime.strptime(line[7:30], "%Y-%m-%d %H:%M:%S.%f").timestamp()
        for line in edge.log().splitlines()
        if link in line
    ]


def publishes(edge: Edge, run: Run) -> int:
    """How many items Pushpin took on the run's channel, by its log."""
    return edge.log().count(f"publish channel={grip.channel(str(run.pk))} ")


def published(edge: Edge, run: Run, seq: int) -> bool:
    """Whether Pushpin took the item that ends with the run's event `seq`, by its debug log (log_level=3)."""
    channel, item_id = f'"channel": "{grip.channel(str(run.pk))}"', f'"id": "{seq}"'
    return any(channel in line and item_id in line for line in edge.log().splitlines() if "IN command: publish" in line)


def signed(key: str, **claims: Any) -> str:
    """A Grip-Sig as Pushpin makes it, with `claims` changed."""
    body = {"iss": "pushpin", "exp": int(time.time()) + 3600, **claims}
    return jwt.encode(body, key, algorithm="HS256")


# --- watchers through the edge ------------------------------------------------------------------


def watched_to_the_end(
    procs: Procs, edge: Edge, run: Run, headers: list[dict[str, str]], *, once_connected: Callable[[], object]
) -> Run:
    """Watchers of the queued `run` through the edge; once all are connected, `once_connected`,
    then a worker takes the run: each watcher gets its exact log. The run, completed."""

    async def scenario() -> list[list[Event]]:
        _, tasks = await watch_all(edge.url, stream_path(run), headers)
        await asyncio.to_thread(once_connected)
        assert all(not task.done() for task in tasks)
        # Only now does a worker take the run.
        await asyncio.to_thread(procs.worker, "edge-worker")
        return list(await asyncio.wait_for(asyncio.gather(*tasks), 60))

    got = asyncio.run(scenario())
    completed = wait_status(run, "completed")
    for events in got:
        assert_exact_log(events, completed)
    return completed


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


# --- what goes wrong ----------------------------------------------------------------------------


@pytest.mark.edge
@pytest.mark.processes
def test_a_lost_publish_is_fetched_from_the_origin_and_leaves_no_gap(procs: Procs, alice: User) -> None:
    with tapped_stack(procs) as (tap, _web, edge):
        procs.worker("edge-worker")
        run = queued_run(alice, input={"deltas": 40, "delay_ms": 40})
        lost = 25
        tap.drop(lost)
        headers = [auth_headers(token_for(alice))] * 5

        async def scenario() -> list[list[Event]]:
            _, tasks = await watch_all(edge.url, stream_path(run), headers)
            return list(await asyncio.wait_for(asyncio.gather(*tasks), 60))

        got = asyncio.run(scenario())
        run = wait_status(run, "completed")
        assert tap.dropped == [lost]
        for events in got:
            assert_exact_log(events, run)
        # Pushpin saw the gap and asked the web process for what it missed: a GET of the next link
        # (the stream's path without its query), after the loss.
        # (Its log is written as it goes, to the millisecond: wait for the line, a millisecond early.)
        wait_until(
            lambda: any(at >= tap.dropped_at - 0.001 for at in link_requests(edge, run)),
            15,
            f"Pushpin's GET of the link after the loss at {tap.dropped_at}",
        )


@pytest.mark.edge
@pytest.mark.processes
def test_a_hold_that_reaches_pushpin_after_its_runs_close_gets_the_rest_and_the_end_within_seconds(
    procs: Procs, alice: User
) -> None:
    control = control_socket()
    # No link fetch of its own within the test: what ends a late stream is the close, or the close again.
    env = edge_env(control, RUNLEDGER_GRIP_LINK_SECONDS="600", RUNLEDGER_GRIP_CLOSE_AGAIN_SECONDS="4")
    web = procs.uvicorn(env=env)
    wait_leading(web)
    # Between Pushpin and the web process: a proxy that keeps chosen answers until the test says.
    proxy = CuttableProxy(web.port).start()
    try:
        # Debug: Pushpin's log then shows each item it takes.
        edge = start_edge(procs, upstream=proxy.port, control=control, log_level=3)
        run = running_run(alice)  # run.created, run.started
        token = token_for(alice)
        # Both published before any stream holds the channel, so that nothing but Pushpin's own
        # fetch a second after the channel's first subscription makes the first stream fetch its link.
        wait_until(lambda: published(edge, run, 2), 15, "the run's events published")

        def is_link_fetch(seen: SeenRequest) -> bool:
            return seen.path.endswith("/stream/link/")

        def is_late_connect(seen: SeenRequest) -> bool:
            return seen.headers.get("last-event-id") == "1"

        def withheld(n: int) -> list[SeenRequest]:
            return wait_until(lambda: len(proxy.withheld) >= n and proxy.withheld, 20, f"{n} answers withheld")

        async def until_ended(stream: Stream, got: list[Event]) -> float:
            async for event in stream.events():
                got.append(event)
            assert stream.finished, "the stream broke instead of ending"
            return time.monotonic()

        async def scenario() -> tuple[list[Event], list[Event], list[Event], float, float, float]:
            # A watcher whose link fetch is kept: it stays on the run's channel past the close, so
            # Pushpin never subscribes the channel anew (which would have the late holds fetch
            # their link a second later by itself) — as the thousands of watchers of a herd do.
            proxy.withhold(is_link_fetch)
            keeper = await Stream(edge.url, stream_path(run), auth_headers(token)).open()
            kept: list[Event] = []
            keeper_ended = asyncio.create_task(until_ended(keeper, kept))
            # Pushpin fetches a new channel's links a second after it subscribes: the keeper's is
            # kept, and no other stream will be fetched that way.
            await asyncio.to_thread(withheld, 1)
            # Two connects whose replay is read now (to seq 2), their holds kept from Pushpin.
            proxy.withhold(is_late_connect)
            late = [Stream(edge.url, stream_path(run), auth_headers(token, "1")) for _ in range(2)]
            opening = [asyncio.create_task(stream.open(timeout=60)) for stream in late]
            await asyncio.to_thread(withheld, 3)
            got: list[list[Event]] = []
            # The run ends; the publisher publishes its last event and the close.
            before = publishes(edge, run)
            await asyncio.to_thread(complete, run)
            await asyncio.to_thread(wait_until, lambda: publishes(edge, run) >= before + 2, 15, "the close")
            closed = time.monotonic()
            # The first hold reaches Pushpin after the close: the close's id tells it at once.
            ends = []
            for answer, within in ((proxy.withheld[1], 10), (proxy.withheld[2], 15)):
                proxy.release(answer)
                opened, _ = await asyncio.wait(
                    [o for o in opening if not o.done()], return_when=asyncio.FIRST_COMPLETED
                )
                stream = opened.pop().result()
                got.append([])
                ends.append(await asyncio.wait_for(until_ended(stream, got[-1]), within))
                # The second, after the first's conflict made Pushpin forget that id: the close sent again.
            assert publishes(edge, run) == before + 3  # the last event, the close, the close again
            proxy.release(proxy.withheld[0])  # the keeper's fetch: the rest of the run, and its end
            await asyncio.wait_for(keeper_ended, 15)
            return kept, got[0], got[1], closed, ends[0], ends[1]

        kept, first_got, second_got, closed, first, second = asyncio.run(asyncio.wait_for(scenario(), 100))
        run = wait_status(run, "completed")
        assert_exact_log(kept, run)
        assert_exact_log(first_got, run, after=1)
        assert_exact_log(second_got, run, after=1)
        # Within seconds, not at a link fetch ten minutes on: at once, and at the close sent again.
        assert first - closed < 3, first - closed
        assert second - closed < 4 + 3, second - closed
    finally:
        proxy.stop()


def complete(run: Run) -> None:
    services.run_complete(run_id=run.pk, generation=fresh(run).generation, output="done")


@pytest.mark.edge
@pytest.mark.processes
def test_a_link_fetch_at_a_streams_lifetime_sends_what_it_missed_before_its_end(procs: Procs, alice: User) -> None:
    # Each stream lives 5 s; its link is fetched at its end, and a second after its connect (the
    # first on a run's channel), and at no other time within the test. Debug: Pushpin's log shows
    # each item it takes.
    lifetime = {"RUNLEDGER_SSE_MAX_SECONDS": "5", "RUNLEDGER_GRIP_LINK_SECONDS": "600"}
    with tapped_stack(procs, log_level=3, **lifetime) as (tap, _web, edge):
        run = running_run(alice)
        token = token_for(alice)
        # Both its events published before the stream connects: no gap makes it fetch sooner.
        wait_until(lambda: published(edge, run, 2), 15, "the run's events published")

        async def scenario() -> tuple[list[Event], float, bool]:
            stream = await Stream(edge.url, stream_path(run), auth_headers(token)).open()
            connected = time.monotonic()
            got: list[Event] = []

            async def read() -> None:
                async for event in stream.events():
                    got.append(event)

            reading = asyncio.create_task(read())
            await asyncio.to_thread(wait_until, lambda: link_requests(edge, run), 15, "the first link fetch")
            # The publish of the next event is lost, and the run stays idle: only the fetch at
            # the stream's end can see the gap.
            tap.drop(3)
            await asyncio.to_thread(
                services.run_events_append,
                run_id=run.pk,
                generation=run.generation,
                events=[(EventType.OUTPUT_DELTA, {"text": "x"})],
            )
            await asyncio.to_thread(wait_until, lambda: tap.dropped == [3], 15, "the loss")
            await asyncio.wait_for(reading, 30)
            return got, time.monotonic() - connected, stream.finished

        got, lived, finished = asyncio.run(asyncio.wait_for(scenario(), 60))
        # The event it missed, then its end (the client would reconnect after it): the run goes on.
        assert finished and lived >= 4.5, (finished, lived)
        assert_exact_log(got, fresh(run))
        assert fresh(run).status == "running"


@pytest.mark.edge
@pytest.mark.processes
def test_refused_publishes_are_sent_again_in_order_without_recovering_pushpin(procs: Procs, alice: User) -> None:
    with tapped_stack(procs) as (tap, web, edge):
        # The new leader syncs Pushpin before its first publish (once Pushpin answers).
        wait_log_line(web, "edge publisher synced")
        recovers = tap.recovers
        procs.worker("edge-worker")
        run = queued_run(alice, input={"deltas": 40, "delay_ms": 40})
        headers = [auth_headers(token_for(alice))] * 5

        # Pushpin busy or unreachable for a moment: the next publishes are refused.
        got = asyncio.run(watch_meanwhile(edge, run, headers, lambda: tap.refuse_next(3)))
        run = wait_status(run, "completed")
        assert tap.refused == 3
        for events in got:
            assert_exact_log(events, run)
        # Sent again, not given up on (a give-up would sync Pushpin again), and never Pushpin's
        # recover (every stream asking again). A change of leader would sync too, and is not this
        # test's concern: the give-up is looked for by its own log line.
        assert tap.recovers == recovers == 0
        assert "trying again" in web.log()
        assert "; syncing it" not in web.log()


@pytest.mark.edge
@pytest.mark.processes
def test_a_new_leader_has_only_the_streams_that_missed_an_event_fetch_it(procs: Procs, alice: User) -> None:
    # No periodic link fetch within the test: every fetch seen is the takeover's doing.
    control = control_socket()
    tap = PublishTap(control).start()
    try:
        web, edge = stack(
            procs, worker=False, control=control, RUNLEDGER_GRIP_URL=tap.url, RUNLEDGER_GRIP_LINK_SECONDS="600"
        )
        # Each with its first two events (run.created, run.started).
        missed, current = running_run(alice), running_run(alice)
        headers = [auth_headers(token_for(alice))] * 3

        def append(run: Run) -> None:
            services.run_events_append(
                run_id=run.pk, generation=run.generation, events=[(EventType.OUTPUT_DELTA, {"text": "x"})]
            )

        async def scenario() -> float:
            got_missed, _ = await watch_all(edge.url, stream_path(missed), headers)
            got_current, _ = await watch_all(edge.url, stream_path(current), headers)
            await until_each_has(got_missed + got_current, 2)
            # The publish of `missed`'s third event is lost, and it stays idle after it.
            tap.drop(3)
            await asyncio.to_thread(append, missed)
            await asyncio.to_thread(wait_until, lambda: tap.dropped == [3], 15, "the loss")
            # The leader loses its database connection: it (or another) leads again and syncs.
            taken_over = time.time()
            await asyncio.to_thread(end_the_publishers_connection)
            await asyncio.to_thread(
                wait_until, lambda: web.log().count("edge publisher synced") == 2, 30, "a second sync"
            )
            # Only the streams behind fetch: `missed`'s get the event lost, with nothing new committed.
            await until_each_has(got_missed, 3)
            # `current`'s streams follow on, and never asked for their link.
            await asyncio.to_thread(append, current)
            await until_each_has(got_current, 3)
            return taken_over

        taken_over = asyncio.run(asyncio.wait_for(scenario(), 90))
        assert any(at >= taken_over for at in link_requests(edge, missed))
        assert [at for at in link_requests(edge, current) if at >= taken_over] == []
        assert tap.recovers == 0
    finally:
        tap.stop()


def end_the_publishers_connection() -> None:
    """What a network cut or a restarted database does to the leading publisher's connection."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE %s",
            ["runledger-edge:%"],
        )
        assert cursor.fetchall(), "no publisher connected"


@pytest.mark.edge
@pytest.mark.processes
def test_killing_the_publishing_web_process_mid_run_leaves_no_gap(procs: Procs, alice: User) -> None:
    control = control_socket()
    # The first web process publishes; Pushpin sends every request to the second, which takes
    # over the publishing when the first dies.
    publisher = procs.uvicorn(env=edge_env(control))
    wait_leading(publisher)
    web = procs.uvicorn(env=edge_env(control))
    edge = start_edge(procs, upstream=web, control=control)
    procs.worker("edge-worker")
    run = queued_run(alice, input={"deltas": 60, "delay_ms": 40})
    headers = [auth_headers(token_for(alice))] * 5

    def kill_the_publisher() -> None:
        assert " leads: " not in web.log()
        publisher.kill()  # SIGKILL, by its PID: no goodbye
        wait_leading(web)

    got = asyncio.run(watch_meanwhile(edge, run, headers, kill_the_publisher))
    run = wait_status(run, "completed")
    for events in got:
        assert_exact_log(events, run)
        assert events[-1].event == "run.completed"


@pytest.mark.edge
@pytest.mark.processes
def test_a_pushpin_restart_mid_run_loses_nothing_for_clients_that_reconnect(procs: Procs, alice: User) -> None:
    print(f"seed {SEED}")
    web, edge = stack(procs)
    token = token_for(alice)
    run = queued_run(alice, input={"deltas": 80, "delay_ms": 40})
    rng = random.Random(SEED)
    api = Api([edge.url], rng, Stats())

    async def scenario() -> list[Any]:
        watches = [asyncio.create_task(follow(api, token, str(run.pk), rng, drop_rate=0)) for _ in range(5)]
        await asyncio.to_thread(in_thread(lambda: wait_until(lambda: fresh(run).last_seq >= 20, 30, "20 events")))
        # SIGTERM to bin/edge: Pushpin stops every part of it, and every client loses its stream.
        # Until the new one says it is ready the clients are sent nowhere (a port nothing listens
        # on), as a load balancer's health check would: in its first ~150 ms Pushpin 1.36 answers a
        # stream "500 Accept service unavailable", which EventSource does not retry (README).
        api.webs = [f"http://127.0.0.1:{free_port()}"]
        parts = list(edge.proc.companions)
        assert await asyncio.to_thread(edge.stop) == 0, edge.log()
        assert all(process_gone(pid) for pid in parts)
        # The same ports again; the clients reconnect with their Last-Event-ID.
        await asyncio.to_thread(start_edge, procs, upstream=web, control=edge.control, port=edge.proc.port)
        api.webs = [edge.url]
        return list(await asyncio.wait_for(asyncio.gather(*watches), 90))

    watches = asyncio.run(scenario())
    run = wait_status(run, "completed")
    for followed in watches:
        assert_exact_log(followed.events, run)
        assert followed.final_status == 204
        assert followed.broken + followed.ended_early >= 1, "the restart did not cut the stream"


# --- access -------------------------------------------------------------------------------------


@pytest.mark.edge
@pytest.mark.processes
def test_a_connect_through_the_edge_is_refused_as_it_is_without_it(
    procs: Procs, alice: User, bob: User, make_user: Callable[..., User]
) -> None:
    web, edge = stack(procs, worker=False)
    run = running_run(alice)
    ended = running_run(alice)
    services.run_complete(run_id=ended.pk, generation=ended.generation, output=None)
    ended = fresh(ended)
    alice_token, bob_token = token_for(alice), token_for(bob)
    cases = [
        ("anonymous", stream_path(run), {}, "GET"),
        ("a bad token", stream_path(run), auth_headers("0" * 40), "GET"),
        ("bob: not his run", stream_path(run), auth_headers(bob_token), "GET"),
        ("no such run", "/api/runs/00000000-0000-0000-0000-000000000000/stream/", auth_headers(alice_token), "GET"),
        ("a malformed cursor", f"/api/runs/{run.pk}/stream/?after_seq=x", auth_headers(alice_token), "GET"),
        ("a cursor past the end", f"/api/runs/{run.pk}/stream/?after_seq=99", auth_headers(alice_token), "GET"),
        ("a POST", stream_path(run), auth_headers(alice_token), "POST"),
        ("a finished run read", stream_path(ended), auth_headers(alice_token, str(ended.last_seq)), "GET"),
    ]
    for what, path, headers, method in cases:
        direct = request_once(web.url, path, headers, method)
        through = request_once(edge.url, path, headers, method)
        assert direct.status in (204, 400, 401, 404, 405), (what, direct.status)
        assert (through.status, through.body) == (direct.status, direct.body), what
        assert "grip-hold" not in through.headers, what
    # An inactive user, with a token that was valid: refused too.
    carol = make_user()
    carol_token = token_for(carol)
    carol.is_active = False
    carol.save()
    assert request_once(edge.url, stream_path(run), auth_headers(carol_token)).status == 401


@pytest.mark.edge
@pytest.mark.processes
def test_a_streams_preflight_through_the_edge_is_answered_not_held_and_its_cors_headers_survive_the_hold(
    procs: Procs, alice: User
) -> None:
    # docs/how-to/cross-origin.md#edge: an app on another origin, listed, reads a held stream.
    app = "http://localhost:5173"
    _web, edge = stack(procs, worker=False, DJANGO_CORS_ALLOWED_ORIGINS=app)
    run = running_run(alice)  # run.created, run.started
    path, token = stream_path(run), token_for(alice)
    asked = {"Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": "authorization,last-event-id"}
    preflight = request_once(edge.url, path, {"Origin": app, **asked}, "OPTIONS")
    assert (preflight.status, preflight.body, preflight.headers["access-control-allow-origin"]) == (200, b"", app)
    assert {"authorization", "last-event-id"} <= set(preflight.headers["access-control-allow-headers"].split(", "))

    async def held() -> tuple[Stream, list[int]]:
        stream = await Stream(edge.url, path, {"Origin": app, **auth_headers(token)}).open()
        seqs = []
        async for event in stream.events():
            seqs.append(event.seq)
            if event.seq == 2:  # the replay: what comes next, Pushpin delivers from a publish
                append = functools.partial(
                    services.run_events_append, run_id=run.pk, generation=run.generation, events=[("custom.x", {})]
                )
                await asyncio.to_thread(in_thread(append))
            if event.seq == 3:
                stream.abort()
        return stream, seqs

    stream, seqs = asyncio.run(asyncio.wait_for(held(), 30))
    assert seqs == [1, 2, 3]
    assert stream.headers["access-control-allow-origin"] == app
    assert stream.headers["access-control-expose-headers"] == "retry-after, idempotent-replayed"
    # Pushpin passed the preflight's answer on, and held the stream (its proxy "accepted" it).
    proxied = [line.partition(" [proxy] ")[2] for line in edge.log().splitlines() if " [proxy] " in line]
    assert any(line.startswith(f"OPTIONS {edge.url}{path} -> ") and line.endswith("code=200 0") for line in proxied)
    assert any(line.startswith(f"GET {edge.url}{path} -> ") and line.endswith(" accept") for line in proxied)


def direct_connect(web: Proc, run: Run, sig: str, headers: dict[str, str]) -> Stream:
    """A connect straight to the web process with Pushpin's signature: what Pushpin passes on, so
    the hold instructions (the link included) are in the answer's headers."""
    return request_once(web.url, stream_path(run), {"Grip-Sig": sig, **headers})


def fetch_link(
    web: Proc, path: str, *, sig: str | None, last_id: int | None, token: str | None
) -> tuple[Stream, list[int]]:
    """A GET of a link as Pushpin makes it (its signature and a Grip-Last for each channel of the
    hold, nothing else): the answer, and the seqs of the events in its body."""
    run_id = path.split("/")[3]
    headers = {"Grip-Sig": sig} if sig is not None else {}
    lasts = [f"{grip.channel(run_id)}; last-id={last_id}"] if last_id is not None else []
    lasts += [f"{grip.LINK_CHANNEL}; last-id={token}"] if token is not None else []
    if lasts:
        headers["Grip-Last"] = ", ".join(lasts)

    async def go() -> tuple[Stream, list[int]]:
        answer = await Stream(web.url, path, headers).open()
        try:
            body = await answer.read_all() if answer.status == 200 else answer.body
            return answer, [event.seq for event in answer.parser.feed(body)]
        finally:
            answer.close()

    return asyncio.run(go())


def link_of(answer: Stream) -> tuple[str, str]:
    """The path of a hold's link (`Grip-Link: </…/stream/link/>; rel=next; …`), and its token (the
    previous id of the link's channel: `Grip-Channel: run-…; prev-id=2, runledger-link; prev-id=T`)."""
    path = answer.headers["grip-link"].partition(">")[0].removeprefix("<")
    return path, answer.headers["grip-channel"].rpartition("prev-id=")[2]


@pytest.mark.edge
@pytest.mark.processes
def test_a_request_that_only_claims_to_be_pushpins_gets_no_events(procs: Procs, alice: User, bob: User) -> None:
    web, edge = stack(procs, worker=False)
    run = running_run(alice)
    key = conf.GRIP_KEY  # the web process's too: the same environment
    last = {"Grip-Last": f"{grip.channel(str(run.pk))}; last-id=0"}
    forged = {
        "no signature": {},
        "a made-up signature": {"Grip-Sig": "x.y.z"},
        "another key": {"Grip-Sig": signed("k" * 64)},
        "expired": {"Grip-Sig": signed(key, exp=int(time.time()) - 10)},
        "another issuer": {"Grip-Sig": signed(key, iss="someone")},
        "no expiry": {"Grip-Sig": jwt.encode({"iss": "pushpin"}, key, algorithm="HS256")},
        "unsigned": {"Grip-Sig": jwt.encode({"iss": "pushpin", "exp": int(time.time()) + 60}, None, algorithm="none")},
    }
    # A real link of alice's, to fetch with each forged signature.
    link, token = link_of(direct_connect(web, run, signed(key), auth_headers(token_for(alice))))
    link_last = {"Grip-Last": f"{last['Grip-Last']}, {grip.LINK_CHANNEL}; last-id={token}"}
    for what, headers in forged.items():
        # Straight to the web process (through Pushpin these headers never arrive): a stream
        # request like any other, so an anonymous one is a 401 and bob's a 404.
        anonymous = request_once(web.url, stream_path(run), {**last, **headers})
        assert (anonymous.status, anonymous.json()["error"]["code"]) == (401, "not_authenticated"), what
        as_bob = request_once(web.url, stream_path(run), {**last, **headers, **auth_headers(token_for(bob))})
        assert as_bob.status == 404, what
        # Through the edge, Pushpin drops the client's Grip-* headers and signs the request itself.
        through = request_once(edge.url, stream_path(run), {**last, **headers})
        assert through.status == 401, what
        # The link, with the forged signature: a credential is wanted (bob's is not one for it).
        fetched = request_once(web.url, link, {**link_last, **headers})
        assert (fetched.status, fetched.json()["error"]["code"]) == (401, "not_authenticated"), what
        fetched = request_once(web.url, link, {**link_last, **headers, **auth_headers(token_for(bob))})
        assert (fetched.status, fetched.json()["error"]["code"]) == (404, "not_found"), what


@pytest.mark.edge
@pytest.mark.processes
def test_a_replayed_grip_sig_or_a_link_of_another_run_gets_nothing(procs: Procs, alice: User, bob: User) -> None:
    web, _edge = stack(procs, worker=False)
    sig = real_grip_sig(procs)  # as a real Pushpin signed it: valid for an hour, on any path
    alices, bobs = running_run(alice), running_run(bob)
    last_alices = {"Grip-Last": f"{grip.channel(str(alices.pk))}; last-id=0"}

    # The attack: Pushpin's signature and Grip-Last for alice's run, on the stream's path. That
    # path takes only a client's connect, with the client's credentials: Grip-Last means nothing.
    replayed = request_once(web.url, stream_path(alices), {"Grip-Sig": sig, **last_alices})
    assert (replayed.status, replayed.json()["error"]["code"]) == (401, "not_authenticated")
    as_bob = direct_connect(web, alices, sig, {**last_alices, **auth_headers(token_for(bob))})
    assert as_bob.status == 404 and "grip-hold" not in as_bob.headers

    # Bob's own connect gets a link for his run (a hold: his run is live)...
    held = direct_connect(web, bobs, sig, auth_headers(token_for(bob)))
    assert (held.status, held.headers["grip-hold"]) == (200, "stream")
    bobs_link, bobs_token = link_of(held)
    assert bobs_link == f"/api/runs/{bobs.pk}/stream/link/"
    assert token_for(bob) not in bobs_token  # the credential in it is sealed
    # ...which fetches his run's events, as Pushpin would...
    fetched, seqs = fetch_link(web, bobs_link, sig=sig, last_id=0, token=bobs_token)
    assert fetched.status == 200 and fetched.headers["grip-hold"] == "stream"
    assert seqs == [1, 2]
    assert link_of(fetched) == (bobs_link, bobs_token)  # the same user, credential and expiry
    # ...but nothing of alice's: for her run it is not a token (an empty end, no hold).
    alices_link = f"/api/runs/{alices.pk}/stream/link/"
    for token in (bobs_token, "x" + bobs_token[1:], "x"):
        other, seqs = fetch_link(web, alices_link, sig=sig, last_id=0, token=token)
        assert (other.status, seqs, other.headers.get("grip-hold")) == (200, [], None), token
    # Nor without the run's Grip-Last, the token, or the signature: not Pushpin's fetch.
    assert fetch_link(web, bobs_link, sig=sig, last_id=None, token=bobs_token)[0].status == 401
    assert fetch_link(web, bobs_link, sig=sig, last_id=0, token=None)[0].status == 401
    assert fetch_link(web, bobs_link, sig=None, last_id=0, token=bobs_token)[0].status == 401

    # A Grip-Sig anywhere else changes nothing: the API still wants a user.
    for path in ("/api/runs/", f"/api/runs/{alices.pk}/", f"/api/runs/{alices.pk}/events/"):
        elsewhere = request(("127.0.0.1", web.port or 0), path, headers={"Grip-Sig": sig, **last_alices})
        assert elsewhere.status == 401, path


@pytest.mark.edge
@pytest.mark.processes
def test_nobody_but_the_web_processes_user_can_publish(procs: Procs, alice: User) -> None:
    require_root("to run the forger as another user (nobody)")
    _web, edge = stack(procs, worker=False)
    run = running_run(alice)
    # Only the client port listens on TCP: there is no HTTP control port to reach.
    assert listening_tcp_ports([edge.proc.pid, *edge.proc.companions]) == {edge.proc.port}
    assert "http control server" not in edge.log()
    socket_file = Path(edge.control.removeprefix("ipc://"))
    assert stat.S_IMODE(socket_file.parent.stat().st_mode) == 0o700
    forged = grip.item(grip.channel(str(run.pk)), [make_frame(3, EventType.RUN_COMPLETED, '{"forged":true}')])

    headers = auth_headers(token_for(alice))

    async def scenario() -> tuple[dict[str, str], list[Event]]:
        got, tasks = await watch_all(edge.url, stream_path(run), [headers])
        await until_each_has(got, 2)
        # Another local user tries the control socket, and POST /publish/ on every TCP port
        # Pushpin has (and the port Pushpin's HTTP control had by default).
        tried = await asyncio.to_thread(forge_as_nobody, edge.control, [edge.proc.port or 0, 5561], forged)
        # Then the run goes on for real: its next event comes right after what the client had.
        await asyncio.to_thread(in_thread(lambda: append_and_complete(run)))
        return tried, (await asyncio.wait_for(tasks[0], 30))

    tried, events = asyncio.run(scenario())
    assert tried["uid"] == 65534
    assert tried["control socket"] == "PermissionError"
    # The client port passes it to the web processes, for which that path is no page.
    assert tried[str(edge.proc.port)].startswith("HTTP/1.1 404"), tried
    assert tried["5561"] == "ConnectionRefusedError"
    assert_exact_log(events, fresh(run))
    assert not any(event.json()["data"].get("forged") for event in events)


def append_and_complete(run: Run) -> None:
    """What a worker would write next: one delta, then the run's end."""
    fresh_run = fresh(run)
    services.run_events_append(
        run_id=run.pk, generation=fresh_run.generation, events=[(EventType.OUTPUT_DELTA, {"text": "real"})]
    )
    services.run_complete(run_id=run.pk, generation=fresh_run.generation, output="real")


@pytest.mark.edge
@pytest.mark.processes
def test_forty_streams_through_the_edge_by_one_user_meet_the_cap(procs: Procs, alice: User) -> None:
    web, edge = stack(procs, worker=False)  # the default cap: 20 streams per user
    assert conf.MAX_STREAMS_PER_USER == 20
    token = token_for(alice)
    first, then = running_run(alice), running_run(alice)

    async def open_many(run: Run, n: int) -> list[Stream]:
        return list(
            await asyncio.gather(*(Stream(edge.url, stream_path(run), auth_headers(token)).open() for _ in range(n)))
        )

    async def scenario() -> tuple[list[int], int, list[int]]:
        opened = await open_many(first, 40)
        statuses = sorted(stream.status for stream in opened)
        # Her own stream of the web process is over the cap too: the edge's count in it.
        direct = await Stream(web.url, stream_path(first), auth_headers(token)).open()
        direct.close()
        # The run ends: its streams end, and their slots are hers again.
        await asyncio.to_thread(in_thread(lambda: append_and_complete(first)))
        for stream in opened:
            if stream.status == 200:
                await asyncio.wait_for(stream.read_all(), 30)
            stream.close()
        again = await open_many(then, 20)
        for stream in again:
            stream.close()
        return statuses, direct.status, [stream.status for stream in again]

    statuses, direct, again = asyncio.run(scenario())
    assert statuses == [200] * 20 + [429] * 20
    assert direct == 429
    assert again == [200] * 20


@pytest.mark.edge
@pytest.mark.processes
def test_a_revoked_users_edge_stream_ends_within_a_link_refresh_on_a_busy_run(
    procs: Procs, make_user: Callable[..., User]
) -> None:
    # A re-check's answer is kept a second here; links are fetched every 2 to 3 s (LINK_SECONDS).
    _web, edge = stack(procs, RUNLEDGER_SSE_RECHECK_SECONDS="1")
    carol, staff = make_user(), make_user(perms=("runs.view_run",))
    run = queued_run(carol, input={"deltas": 400, "delay_ms": 50})  # 20 s of events, 20 a second
    headers = [auth_headers(token_for(carol)), session_headers(staff)]

    def revoke() -> None:
        User.objects.filter(pk=carol.pk).update(is_active=False)
        Session.objects.all().delete()  # the staff member logged out (every session ended)

    async def scenario() -> tuple[list[list[Event]], list[float], float]:
        got, tasks = await watch_all(edge.url, stream_path(run), headers)
        await until_each_has(got, 5)
        await asyncio.to_thread(in_thread(revoke))
        revoked = time.monotonic()
        ended: list[float] = []
        for task in tasks:
            await asyncio.wait_for(task, 20)
            ended.append(time.monotonic() - revoked)
        return got, ended, revoked

    got, ended, _ = asyncio.run(scenario())
    # Events came all along (the run is busy), and each stream ended within a link refresh and a
    # re-check, long before the run did.
    print(f"streams ended {', '.join(f'{s:.1f}' for s in ended)} s after the revocation")
    assert all(seconds < 2 * 1.5 + 1 + 2 for seconds in ended)
    assert fresh(run).status == "running"
    for events in got:
        assert events[-1].event != EventType.RUN_COMPLETED
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
    # Their reconnects are refused as any new stream would be.
    assert request_once(edge.url, stream_path(run), headers[0]).status == 401
    assert request_once(edge.url, stream_path(run), headers[1]).status == 401


@pytest.mark.edge
@pytest.mark.processes
def test_a_revocation_closes_the_users_edge_streams_at_once_without_waiting_for_a_link_fetch(
    procs: Procs, make_user: Callable[..., User]
) -> None:
    # Links are fetched only after 10 minutes here: what ends the streams is the publisher's close.
    _web, edge = stack(procs, RUNLEDGER_GRIP_LINK_SECONDS="600", RUNLEDGER_GRIP_LINK_FIRST_SECONDS="600")
    sees_all = ("runs.view_run",)
    carol, dave, staff, other = (
        make_user(),
        make_user(perms=sees_all),
        make_user(perms=sees_all),
        make_user(perms=sees_all),
    )
    run = queued_run(carol, input={"deltas": 400, "delay_ms": 50})  # 20 s of events, 20 a second
    browser = Client()
    browser.force_login(staff)
    carol_token, dave_token = token_for(carol), token_for(dave)
    headers = [
        auth_headers(carol_token),
        auth_headers(carol_token),
        auth_headers(dave_token),
        {"Cookie": f"sessionid={browser.cookies['sessionid'].value}"},
        auth_headers(token_for(other)),  # a user nothing happens to: watches on
    ]

    def revoke() -> None:
        ApiToken.objects.filter(digest=key_digest(carol_token)).delete()  # her token deleted
        dave.is_active = False
        dave.save()  # deactivated
        browser.logout()  # the staff member logged out

    async def scenario() -> tuple[list[list[Event]], list[float], bool]:
        got, tasks = await watch_all(edge.url, stream_path(run), headers)
        await until_each_has(got, 5)
        bystander = tasks.pop()
        revoked = time.monotonic()
        await asyncio.to_thread(in_thread(revoke))
        ended: list[float] = []
        for task in tasks:
            await asyncio.wait_for(task, 20)
            ended.append(time.monotonic() - revoked)
        still_watching = not bystander.done()
        bystander.cancel()
        return got, ended, still_watching

    got, ended, still_watching = asyncio.run(scenario())
    print(f"streams ended {', '.join(f'{s:.1f}' for s in ended)} s after the revocation")
    assert all(seconds < 5 for seconds in ended)
    assert still_watching
    assert fresh(run).status == "running"
    for events in got[:-1]:
        assert events[-1].event != EventType.RUN_COMPLETED
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
    # Their reconnects are refused as any new stream would be.
    for revoked_headers in headers[:-1]:
        assert request_once(edge.url, stream_path(run), revoked_headers).status == 401


@pytest.mark.edge
@pytest.mark.processes
def test_an_edge_stream_ends_at_its_lifetime_and_the_client_resumes_without_a_gap(procs: Procs, alice: User) -> None:
    _web, edge = stack(procs, RUNLEDGER_SSE_MAX_SECONDS="2")
    token = token_for(alice)
    run = queued_run(alice, input={"deltas": 100, "delay_ms": 100})  # 10 s and more
    rng = random.Random(SEED)
    api = Api([edge.url], rng, Stats())

    async def scenario() -> Any:
        return await asyncio.wait_for(follow(api, token, str(run.pk), rng, drop_rate=0), 90)

    followed = asyncio.run(scenario())
    run = wait_status(run, "completed")
    assert_exact_log(followed.events, run)
    assert followed.final_status == 204
    # The server ended it cleanly, before the terminal event, more than once: each stream lives 2 s
    # (to the next whole second, and the link fetch's second).
    assert followed.ended_early >= 2 and followed.broken == 0, followed


@pytest.mark.edge
@pytest.mark.processes
def test_nginx_in_front_of_the_edge_drops_half_sent_requests_before_pushpin_sees_them(
    procs: Procs, alice: User
) -> None:
    web, edge = stack(procs)
    folder = shared_folder("runledger-edge-nginx-")
    try:
        (folder / "static").mkdir()
        front = start_nginx(
            procs, upstream=web, stream_upstream=edge.proc, static_root=folder / "static", prefix=folder / "nginx"
        )
        run = queued_run(alice, input={"deltas": 10, "delay_ms": 20})
        # The streams go through nginx to the edge, and hold there.
        events = asyncio.run(watch(front.url, stream_path(run), auth_headers(token_for(alice)), timeout=60))
        assert_exact_log(events, wait_status(run, "completed"))
        assert f"/api/runs/{run.pk}/stream/" in edge.log()

        # Twenty clients that never finish their headers, twenty whose bodies stall, on the
        # streams' path: nginx closes each after its 10 s timeouts.
        slow_path = f"/api/runs/{run.pk}/stream/?probe=slow"
        with ThreadPoolExecutor(40) as pool:
            trickles = [
                pool.submit(trickle_headers, front.address, slow_path, every=1.0, timeout=30) for _ in range(20)
            ]
            stalls = [pool.submit(stall_body, front.address, slow_path, timeout=30) for _ in range(20)]
            closed = [future.result() for future in trickles + stalls]
        print(f"closed after {min(c.seconds for c in closed):.1f} to {max(c.seconds for c in closed):.1f} s")
        assert all(9 <= c.seconds < 15 for c in closed)
        assert "probe=slow" not in edge.log() and "probe=slow" not in web.log()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.edge
@pytest.mark.processes
def test_an_edge_answer_replays_about_5_mb_at_most_and_the_client_resumes_from_there(procs: Procs, alice: User) -> None:
    web = procs.uvicorn(env=edge_env(control_socket()))
    run = running_run(alice)
    # 40 events of 250 kB each (10 MB) after run.created and run.started.
    big = [(EventType.OUTPUT_DELTA, {"text": "x" * 250_000})] * 40
    services.run_events_append(run_id=run.pk, generation=run.generation, events=big)
    token = token_for(alice)
    sig = signed(conf.GRIP_KEY)

    def connect(last_event_id: str | None) -> tuple[Stream, list[int], int]:
        async def go() -> tuple[Stream, list[int], int]:
            answer = await Stream(
                web.url, stream_path(run), {"Grip-Sig": sig, **auth_headers(token, last_event_id)}
            ).open()
            try:
                body = await answer.read_all()
                return answer, [event.seq for event in answer.parser.feed(body)], len(body)
            finally:
                answer.close()

        return asyncio.run(go())

    seen: list[int] = []
    sizes: list[int] = []
    while True:
        answer, seqs, size = connect(str(seen[-1]) if seen else None)
        assert answer.status == 200
        seen += seqs
        sizes.append(size)
        if "grip-hold" in answer.headers:
            break  # caught up with the run: held from here
    print(f"answers of {', '.join(f'{size / 1e6:.2f}' for size in sizes)} MB")
    assert seen == list(range(1, 43))
    assert len(sizes) >= 2 and max(sizes) <= 5_000_000


# --- bin/edge and the settings ------------------------------------------------------------------


@pytest.mark.edge
@pytest.mark.processes
def test_bin_edge_runs_pushpin_in_the_foreground_until_sigterm(procs: Procs, alice: User) -> None:
    control = control_socket()
    web = procs.uvicorn(env=edge_env(control))
    edge = start_edge(procs, upstream=web, control=control)
    run = running_run(alice)
    token = token_for(alice)

    async def held() -> Stream:
        stream = await Stream(edge.url, stream_path(run), auth_headers(token)).open()
        assert stream.status == 200
        return stream

    async def scenario() -> list[Event]:
        stream = await held()
        events = [event async for event in _until_seq(stream, 2)]
        # SIGTERM to bin/edge's PID: it passes it on to Pushpin, which stops every part of it.
        parts = list(edge.proc.companions)
        edge.proc.signal(signal.SIGTERM)
        assert await asyncio.to_thread(edge.proc.popen.wait, 15) == 0, edge.log()
        await asyncio.to_thread(wait_until, lambda: all(process_gone(pid) for pid in parts), 10, "Pushpin's parts gone")
        rest = [event async for event in stream.events()]  # the held stream ends with it
        return events + rest

    events = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert [e.seq for e in events] == [1, 2]
    assert "stopped" in edge.log()


async def _until_seq(stream: Stream, seq: int) -> Any:
    async for event in stream.events():
        yield event
        if event.seq >= seq:
            return


def _settings_of(**env: str) -> subprocess.CompletedProcess[str]:
    code = "import django; django.setup(); from runs.conf import conf; print(conf.GRIP_KEY)"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**subprocess_env(), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_signing_key_is_derived_from_the_secret_key_unless_set() -> None:
    derived = _settings_of(DJANGO_SECRET_KEY="s" * 50)
    assert derived.stdout.strip() == hmac.new(b"s" * 50, b"runledger.grip-key", hashlib.sha256).hexdigest()
    assert _settings_of(DJANGO_SECRET_KEY="t" * 50).stdout.strip() != derived.stdout.strip()
    chosen = "K" * 40
    assert _settings_of(RUNLEDGER_GRIP_KEY=chosen).stdout.strip() == chosen
    # A key Pushpin's configuration would read otherwise (a file, base64, a list), or too short.
    for bad in ("file:/etc/key" + "x" * 30, "a,b" + "x" * 40, "short"):
        refused = _settings_of(RUNLEDGER_GRIP_KEY=bad)
        assert refused.returncode != 0
        assert "RUNLEDGER_GRIP_KEY must be" in refused.stderr


def test_a_web_process_with_an_edge_on_sqlite_refuses_to_start(tmp_path: Any) -> None:
    env = subprocess_env(
        RUNLEDGER_GRIP_URL=f"ipc://{tmp_path}/control", DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite3"
    )
    refused = uvicorn_refusal(env)
    assert "RUNLEDGER_GRIP_URL needs PostgreSQL" in refused.stderr


# --- the protocol, in this process ---------------------------------------------------------------


def test_grip_last_is_read_for_the_runs_channel_only() -> None:
    factory = RequestFactory()
    one = factory.get("/", HTTP_GRIP_LAST="run-a; last-id=7")
    assert grip.last_id(one, "run-a") == "7"
    assert grip.last_id(one, "run-b") is None
    several = factory.get("/", HTTP_GRIP_LAST="run-b; last-id=3, run-a ;last-id=9")
    assert grip.last_id(several, "run-a") == "9"
    assert grip.last_id(factory.get("/"), "run-a") is None


def test_publish_items_carry_string_ids_and_bodies_stay_under_the_limit() -> None:
    first = grip.item("run-x", [make_frame(1, EventType.RUN_CREATED, "{}")])
    assert (first["id"], first["prev-id"]) == ("1", "0")
    # Events read together go out as one item: the chain of items is the chain of seqs, and each
    # frame keeps its own id line.
    several = grip.item("run-x", [make_frame(n, EventType.OUTPUT_DELTA, "{}") for n in (4, 5, 6)])
    assert (several["id"], several["prev-id"]) == ("6", "3")
    content = several["formats"]["http-stream"]["content"]
    assert [line for line in content.splitlines() if line.startswith("id: ")] == ["id: 4", "id: 5", "id: 6"]
    # The close follows the terminal event, with an id no hold can have (Pushpin keeps the channel's
    # last id); sent again, it carries none (Pushpin would drop an id it saw) and skips the sequencer.
    assert grip.close_item("run-x", 9) == {
        "channel": "run-x",
        "id": "9-end",
        "prev-id": "9",
        "formats": {"http-stream": {"action": "close"}},
    }
    assert grip.close_again_item("run-x", 9) == {
        "channel": "run-x",
        "prev-id": "9",
        "no-seq": True,
        "formats": {"http-stream": {"action": "close"}},
    }
    assert tnetstring(grip.close_again_item("run-x", 9)).count(b"4:true!") == 1
    frames = [make_frame(n, EventType.OUTPUT_DELTA, '"' + "x" * 100_000 + '"') for n in range(1, 21)]
    groups = _groups(frames)
    assert [f.seq for group in groups for f in group] == list(range(1, 21))
    found = bodies([grip.item("run-x", group) for group in groups])
    assert len(found) > 1 and all(len(body) <= 512 * 1024 for body in found)
    # ZRPC's encoding (tnetstring): the items come back as they were, text as bytes.
    items = [i for body in found for i in parse_tnetstring(body)[0]["items"]]
    assert [(i["prev-id"], i["id"]) for i in items] == [(str(n - 1).encode(), str(n).encode()) for n in range(1, 21)]
    assert parse_tnetstring(tnetstring({"a": [1, True, None, "é"]})) == ({"a": [1, True, None, "é".encode()]}, b"")
    small = _groups([make_frame(n, EventType.OUTPUT_DELTA, "{}") for n in range(1, 101)])
    assert len(small) == 1
    # The publishers of one set of Pushpins share a lock, whatever order the set is given in.
    assert lock_key(["ipc:///a", "ipc:///b"]) == lock_key(["ipc:///b", "ipc:///a"]) != lock_key(["ipc:///a"])


@pytest.mark.sqlite
def test_the_publisher_reads_every_run_named_in_one_statement(alice: User) -> None:
    first, second, ended = running_run(alice), running_run(alice), running_run(alice)
    for run, n in ((first, 3), (second, 2)):
        deltas = [(EventType.OUTPUT_DELTA, {"text": str(i)}) for i in range(n)]
        services.run_events_append(run_id=run.pk, generation=fresh(run).generation, events=deltas)
    services.run_complete(run_id=ended.pk, generation=fresh(ended).generation, output="done")
    last = fresh(first).last_seq
    heads: dict[str, int | None] = {str(first.pk): last - 2, str(second.pk): None, str(ended.pk): None}
    heads[str(uuid.uuid4())] = 0  # a run deleted since it was named
    with CaptureQueriesContext(connection) as queries:
        news = runs_events_after_heads(heads=heads, limit=2)
    if connection.vendor == "postgresql":
        assert len(queries) == 1
    assert set(news) == {str(first.pk), str(second.pk), str(ended.pk)}
    # After the head, at most `limit`, in seq order, the bytes every stream sends.
    assert [row[0] for row in news[str(first.pk)].rows] == [last - 1, last]
    assert news[str(first.pk)].rows == run_events_json_after(run_id=first.pk, after_seq=last - 2, limit=2)
    # A run not seen yet: from its first event while live; only its state once ended.
    assert [row[0] for row in news[str(second.pk)].rows] == [1, 2]
    assert news[str(ended.pk)].rows == [] and news[str(ended.pk)].status == "completed"
    assert news[str(ended.pk)].last_seq == fresh(ended).last_seq


def test_the_first_link_fetch_comes_sooner_and_every_hold_is_on_its_users_channel(settings: Any) -> None:
    settings.RUNLEDGER_GRIP_LINK_SECONDS = 600
    settings.RUNLEDGER_GRIP_LINK_FIRST_SECONDS = 120
    settings.RUNLEDGER_MAX_STREAMS_PER_USER = 20
    first = {grip.link_timeout(seconds_left=None, first=True) for _ in range(300)}
    later = {grip.link_timeout(seconds_left=None, first=False) for _ in range(300)}
    # Spread over four values, not one a second: Pushpin keeps a timer per link path and timeout.
    assert first <= {120, 140, 160, 180} and later <= {600, 700, 800, 900} and len(later) > 1
    # Sooner only for the cap's sake: with streams uncapped, nothing counts until a fetch.
    settings.RUNLEDGER_MAX_STREAMS_PER_USER = 0
    assert {grip.link_timeout(seconds_left=None, first=True) for _ in range(300)} <= {600, 700, 800, 900}
    settings.RUNLEDGER_MAX_STREAMS_PER_USER = 20
    assert grip.link_timeout(seconds_left=30.5, first=False) == 31  # never past the link's expiry
    settings.RUNLEDGER_GRIP_LINK_SECONDS = 2  # the first is never later than the others
    assert {grip.link_timeout(seconds_left=None, first=True) for _ in range(50)} <= {2, 3}
    headers = grip.hold_headers(name="run-x", prev_id=4, user_id=7, link="/l/", token="t", timeout=9)
    assert headers["Grip-Channel"] == "run-x; prev-id=4, runledger-link; prev-id=t, runledger-user-7"
    # A revocation closes that channel, with no id: every stream on it ends, wherever it is.
    assert grip.close_user_item(7) == {"channel": "runledger-user-7", "formats": {"http-stream": {"action": "close"}}}


def test_a_link_is_sealed_for_its_run_and_carries_its_credential_unreadable() -> None:
    for token_id, session_key in ((123_456_789, None), (None, "s" * 32)):
        minted = Link(run_id="r1", user_id=7, token_id=token_id, session_key=session_key, expires=1_900_000_000)
        token = mint(minted)
        assert read(run_id="r1", token=token) == minted
        assert token != mint(minted)  # a new nonce each time
        raw = base64.urlsafe_b64decode(token + "==")
        assert str(token_id or session_key).encode()[:8] not in raw
        # Another run, a changed byte, a cut: not a token.
        assert read(run_id="r2", token=token) is None
        changed = token[:20] + ("A" if token[20] != "A" else "B") + token[21:]
        assert read(run_id="r1", token=changed) is None
        assert read(run_id="r1", token=token[:-4]) is None
    assert read(run_id="r1", token="!!") is None


def test_the_control_folder_must_be_this_users_alone(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private_folder(private)
    assert stat.S_IMODE(private.stat().st_mode) == 0o700 and folder_problem(private) is None
    open_one = tmp_path / "open"
    open_one.mkdir()
    open_one.chmod(0o755)
    with pytest.raises(PermissionError, match="other users may reach it"):
        private_folder(open_one)
    link = tmp_path / "link"
    link.symlink_to(private)
    assert "is a symbolic link" in str(folder_problem(link))
    with pytest.raises(ValueError, match="ipc://"):
        socket_path("http://127.0.0.1:5561")
    with pytest.raises(ValueError, match="longer"):
        socket_path("ipc:///" + "x" * 200)


def test_a_web_process_with_an_http_control_port_refuses_to_start() -> None:
    refused = uvicorn_refusal(subprocess_env(RUNLEDGER_GRIP_URL="http://127.0.0.1:5561"))
    assert "RUNLEDGER_GRIP_URL must be a list of ipc:///PATH URLs" in refused.stderr


@pytest.mark.processes
def test_without_an_edge_a_valid_signature_changes_nothing(procs: Procs, alice: User) -> None:
    # No RUNLEDGER_GRIP_URL (the default): the stream view never looks at Grip-* headers.
    web = procs.uvicorn(env=subprocess_env())
    run = running_run(alice)
    claimed = {"Grip-Sig": signed(conf.GRIP_KEY), "Grip-Last": f"{grip.channel(str(run.pk))}; last-id=0"}
    assert request_once(web.url, stream_path(run), claimed).status == 401
