"""Access through the SSE edge (docs/design/edge.md): a connect through the edge is checked like any
stream; a replayed Grip-Sig, a request that only claims to be Pushpin's, or a link minted for another
run gets nothing; nobody but the web processes' user can publish; the edge's streams count against
the per-user cap, end at their lifetime and when their user is revoked; nginx in front of the edge
drops half-sent requests before Pushpin sees them; an answer replays about 5 MB at most."""

import asyncio
import functools
import random
import shutil
import stat
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jwt
import pytest
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.test import Client

from runs import services
from runs.conf import conf
from runs.events import EventType
from runs.models import ApiToken, Run, key_digest
from runs.streaming.edge import grip
from runs.streaming.hub import make_frame
from tests.factories import queued_run, running_run
from tests.support.db import token_for
from tests.support.edge import (
    append_and_complete,
    control_socket,
    direct_connect,
    edge_env,
    fetch_link,
    forge_as_nobody,
    link_of,
    listening_tcp_ports,
    real_grip_sig,
    session_headers,
    signed,
    stack,
    stall_body,
    until_each_has,
    watch_all,
    watch_revoked,
)
from tests.support.faults import Api, Stats, follow
from tests.support.nginx import shared_folder, start_nginx
from tests.support.procs import Procs, require_root
from tests.support.raw_http import request, trickle_headers
from tests.support.runs import assert_exact_log, fresh
from tests.support.seed import SEED
from tests.support.sse import Event, Stream, auth_headers, request_once, stream_path, watch
from tests.support.threads import in_thread
from tests.support.waiting import wait_until
from tests.support.workers import wait_status

pytestmark = [
    pytest.mark.edge,
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]


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


def test_a_revoked_users_edge_stream_ends_within_a_link_refresh_on_a_busy_run(
    procs: Procs, make_user: Callable[..., User]
) -> None:
    # A re-check's answer is kept a second here; links are fetched every 2 to 3 s (LINK_SECONDS).
    # A plain UPDATE announces nothing: a web process that holds carol's token in its token cache
    # learns of it when the entry's age (1 s here) runs out (docs/design/api.md#token-cache).
    _web, edge = stack(procs, RUNLEDGER_SSE_RECHECK_SECONDS="1", RUNLEDGER_TOKEN_CACHE_SECONDS="1")
    carol, staff = make_user(), make_user(perms=("runs.view_run",))
    run = queued_run(carol, input={"deltas": 400, "delay_ms": 50})  # 20 s of events, 20 a second
    headers = [auth_headers(token_for(carol)), session_headers(staff)]

    def revoke() -> None:
        User.objects.filter(pk=carol.pk).update(is_active=False)
        Session.objects.all().delete()  # the staff member logged out (every session ended)

    watched = asyncio.run(watch_revoked(edge, run, headers, revoke))
    # Events came all along (the run is busy), and each stream ended within a link refresh and a
    # re-check, long before the run did.
    print(f"streams ended {', '.join(f'{s:.1f}' for s in watched.ended)} s after the revocation")
    assert all(seconds < 2 * 1.5 + 1 + 2 for seconds in watched.ended)
    assert fresh(run).status == "running"
    for events in watched.got:
        assert events[-1].event != EventType.RUN_COMPLETED
        assert [e.seq for e in events] == list(range(1, len(events) + 1))

    # Their reconnects are refused as any new stream would be.
    def refused(header: dict[str, str]) -> bool:
        return request_once(edge.url, stream_path(run), header).status == 401

    for header in headers:
        wait_until(functools.partial(refused, header), 10, "a reconnect refused")


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

    watched = asyncio.run(watch_revoked(edge, run, headers, revoke, bystanders=1))
    print(f"streams ended {', '.join(f'{s:.1f}' for s in watched.ended)} s after the revocation")
    assert all(seconds < 5 for seconds in watched.ended)
    assert watched.bystanders_watch
    assert fresh(run).status == "running"
    for events in watched.got[:-1]:
        assert events[-1].event != EventType.RUN_COMPLETED
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
    # Their reconnects are refused as any new stream would be.
    for revoked_headers in headers[:-1]:
        assert request_once(edge.url, stream_path(run), revoked_headers).status == 401


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
