"""The SSE edge (DESIGN §10): Debian's Pushpin, started by bin/edge, holds the streams in front of
real uvicorn web processes, which answer with the replay and hold instructions and publish every
committed event themselves; a real worker process runs the runs. Every process is started and
stopped by its PID (tests/support/procs.py, tests/support/edge.py).

What is proven: watchers through the edge get every event once, in order; Last-Event-ID resumes
exactly; a lost publish, a killed publisher and a restarted Pushpin leave no gap; a connect
through the edge is checked like any stream, a request that only claims to be Pushpin's gets
nothing, and the edge's streams do not count against the per-user cap.
"""

import asyncio
import hashlib
import hmac
import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import jwt
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client, RequestFactory

from runs import services
from runs.edge import grip
from runs.edge.control import bodies
from runs.edge.publisher import _groups, lock_key
from runs.models import Run
from runs.streams import make_frame
from tests.factories import queued_run, running_run
from tests.support.db import token_for
from tests.support.edge import Edge, PublishTap, edge_env, start_edge, wait_leading
from tests.support.faults import Api, Stats, follow
from tests.support.procs import (
    ROOT,
    Proc,
    Procs,
    connections_to,
    free_port,
    process_gone,
    subprocess_env,
    uvicorn_refusal,
    wait_log_line,
)
from tests.support.runs import assert_exact_log, fresh
from tests.support.seed import SEED
from tests.support.sse import Event, Stream, auth_headers, request_once, stream_path, watch
from tests.support.threads import in_thread
from tests.support.waiting import wait_until
from tests.support.workers import wait_status

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def stack(procs: Procs, *, worker: bool = True, control: int = 0, **env: str) -> tuple[Proc, Edge]:
    """A web process behind bin/edge, leading the publishing, and a worker unless told not to
    (tests that claim runs themselves)."""
    control = control or free_port()
    web = procs.uvicorn(env=edge_env(control, **env))
    wait_leading(web)
    edge = start_edge(procs, upstream=web, control_port=control)
    if worker:
        procs.worker("edge-worker", concurrency=4)
    return web, edge


@contextmanager
def tapped_stack(procs: Procs) -> Iterator[tuple[PublishTap, Proc, Edge]]:
    """`stack` without its worker, the publishes going to Pushpin through a tap that can lose or
    refuse them."""
    control = free_port()
    tap = PublishTap(control_port=control).start()
    try:
        yield (tap, *stack(procs, worker=False, control=control, RUNLEDGER_GRIP_URL=tap.url))
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
    link = f"[handler] GET {edge.url}/api/runs/{run.pk}/stream/ "
    return [
        datetime.strptime(line[7:30], "%Y-%m-%d %H:%M:%S.%f").timestamp()
        for line in edge.log().splitlines()
        if link in line
    ]


def signed(key: str, **claims: Any) -> str:
    """A Grip-Sig as Pushpin makes it, with `claims` changed."""
    body = {"iss": "pushpin", "exp": int(time.time()) + 3600, **claims}
    return jwt.encode(body, key, algorithm="HS256")


# --- watchers through the edge ------------------------------------------------------------------


@pytest.mark.edge
@pytest.mark.processes
def test_watchers_through_the_edge_receive_every_event_once_in_order(
    procs: Procs, alice: User, make_user: Callable[..., User]
) -> None:
    control = free_port()
    web = procs.uvicorn(env=edge_env(control))
    wait_leading(web)
    edge = start_edge(procs, upstream=web, control_port=control)
    staff = make_user(perms=("runs.view_run",))
    run = queued_run(alice, input={"deltas": 40, "delay_ms": 25})
    # Programs with their token, browsers with their session, and staff who see every run.
    headers = [auth_headers(token_for(alice))] * 10 + [session_headers(alice)] * 10
    headers += [auth_headers(token_for(staff))] * 10

    async def scenario() -> list[list[Event]]:
        _, tasks = await watch_all(edge.url, stream_path(run), headers)
        # Pushpin holds every watcher: once the connections it opened for their connects have
        # idled out, the web process holds none of theirs.
        await asyncio.to_thread(wait_until, lambda: connections_to(web.port) <= 2, 20, "the web process idle")
        assert all(not task.done() for task in tasks)
        # Only now does a worker take the run.
        await asyncio.to_thread(procs.worker, "edge-worker")
        return list(await asyncio.wait_for(asyncio.gather(*tasks), 60))

    got = asyncio.run(scenario())
    run = wait_status(run, "completed")
    for events in got:
        assert_exact_log(events, run)
    # Each event was published once, not once per watcher.
    assert edge.log().count("POST /publish/") <= run.last_seq


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
def test_refused_publishes_are_sent_again_in_order_without_recovering_pushpin(procs: Procs, alice: User) -> None:
    with tapped_stack(procs) as (tap, web, edge):
        # The new leader recovers Pushpin before its first publish (once Pushpin answers).
        wait_log_line(web, "edge publisher recovered")
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
        # Sent again, not given up on: no recover, which would have every stream ask again.
        assert tap.recovers == recovers
        assert "trying again" in web.log()


@pytest.mark.edge
@pytest.mark.processes
def test_killing_the_publishing_web_process_mid_run_leaves_no_gap(procs: Procs, alice: User) -> None:
    control = free_port()
    # The first web process publishes; Pushpin sends every request to the second, which takes
    # over the publishing when the first dies.
    publisher = procs.uvicorn(env=edge_env(control))
    wait_leading(publisher)
    web = procs.uvicorn(env=edge_env(control))
    edge = start_edge(procs, upstream=web, control_port=control)
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
        parts = list(edge.proc.companions)
        assert await asyncio.to_thread(edge.stop) == 0, edge.log()
        assert all(process_gone(pid) for pid in parts)
        # The same ports again; the clients reconnect with their Last-Event-ID.
        await asyncio.to_thread(start_edge, procs, upstream=web, control_port=edge.control_port, port=edge.proc.port)
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
def test_a_request_that_only_claims_to_be_pushpins_recovery_gets_no_events(
    procs: Procs, alice: User, bob: User
) -> None:
    web, edge = stack(procs, worker=False)
    run = running_run(alice)
    key = settings.RUNLEDGER_GRIP_KEY  # the web process's too: the same environment
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

    # What does authorise a recovery: Pushpin's signature, with no user at all.
    async def recover() -> tuple[Stream, bytes]:
        answer = await Stream(web.url, f"/api/runs/{run.pk}/stream/", {**last, "Grip-Sig": signed(key)}).open()
        try:
            return answer, await answer.read_all()
        finally:
            answer.close()

    recovered, body = asyncio.run(recover())
    assert recovered.status == 200
    assert recovered.headers["grip-hold"] == "stream"
    assert [e.seq for e in recovered.parser.feed(body)] == [1, 2]


@pytest.mark.edge
@pytest.mark.processes
def test_streams_held_by_the_edge_do_not_count_against_the_users_cap(procs: Procs, alice: User) -> None:
    web, edge = stack(procs, RUNLEDGER_MAX_STREAMS_PER_USER="2")
    token = token_for(alice)
    run = queued_run(alice, input={"deltas": 30, "delay_ms": 50})

    async def scenario() -> tuple[list[list[Event]], list[int]]:
        # Five through the edge, more than the cap of two...
        _, tasks = await watch_all(edge.url, stream_path(run), [auth_headers(token)] * 5)
        # ...and the web process still lets her open two of its own, and refuses a third.
        direct = [await Stream(web.url, stream_path(run), auth_headers(token)).open() for _ in range(3)]
        statuses = [stream.status for stream in direct]
        for stream in direct:
            stream.close()
        return list(await asyncio.wait_for(asyncio.gather(*tasks), 60)), statuses

    got, statuses = asyncio.run(scenario())
    assert statuses == [200, 200, 429]
    run = wait_status(run, "completed")
    for events in got:
        assert_exact_log(events, run)


# --- bin/edge and the settings ------------------------------------------------------------------


@pytest.mark.edge
@pytest.mark.processes
def test_bin_edge_runs_pushpin_in_the_foreground_until_sigterm(procs: Procs, alice: User) -> None:
    control = free_port()
    web = procs.uvicorn(env=edge_env(control))
    edge = start_edge(procs, upstream=web, control_port=control)
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
    code = "import django; django.setup(); from django.conf import settings; print(settings.RUNLEDGER_GRIP_KEY)"
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
    env = subprocess_env(RUNLEDGER_GRIP_URL="http://127.0.0.1:1", DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite3")
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
    first = grip.item("run-x", [make_frame(1, "run.created", "{}")])
    assert (first["id"], first["prev-id"]) == ("1", "0")
    # Events read together go out as one item: the chain of items is the chain of seqs, and each
    # frame keeps its own id line.
    several = grip.item("run-x", [make_frame(n, "output.delta", "{}") for n in (4, 5, 6)])
    assert (several["id"], several["prev-id"]) == ("6", "3")
    assert several["formats"]["http-stream"]["content"].count("\nid: ") == 2
    assert grip.close_item("run-x", 9) == {
        "channel": "run-x",
        "prev-id": "9",
        "formats": {"http-stream": {"action": "close"}},
    }
    frames = [make_frame(n, "output.delta", '"' + "x" * 100_000 + '"') for n in range(1, 21)]
    groups = _groups(frames)
    assert [f.seq for group in groups for f in group] == list(range(1, 21))
    found = bodies([grip.item("run-x", group) for group in groups])
    assert len(found) > 1 and all(len(body) <= 512 * 1024 for body in found)
    items = [i for body in found for i in json.loads(body)["items"]]
    assert [(i["prev-id"], i["id"]) for i in items] == [(str(n - 1), str(n)) for n in range(1, 21)]
    small = _groups([make_frame(n, "output.delta", "{}") for n in range(1, 101)])
    assert len(small) == 1
    # The publishers of one set of Pushpins share a lock, whatever order the set is given in.
    assert lock_key(["http://a", "http://b"]) == lock_key(["http://b", "http://a"]) != lock_key(["http://a"])


@pytest.mark.processes
def test_without_an_edge_a_valid_signature_changes_nothing(procs: Procs, alice: User) -> None:
    # No RUNLEDGER_GRIP_URL (the default): the stream view never looks at Grip-* headers.
    web = procs.uvicorn(env=subprocess_env())
    run = running_run(alice)
    claimed = {"Grip-Sig": signed(settings.RUNLEDGER_GRIP_KEY), "Grip-Last": f"{grip.channel(str(run.pk))}; last-id=0"}
    assert request_once(web.url, stream_path(run), claimed).status == 401
