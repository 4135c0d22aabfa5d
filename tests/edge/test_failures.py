"""What goes wrong at the SSE edge (docs/design/edge.md), with real Pushpin, web and worker processes:
a lost or refused publish, a hold that arrives late, a link fetched at a stream's lifetime, a new
leading publisher, a killed publishing web process and a restarted Pushpin leave no gap."""

import asyncio
import random
import time
from typing import Any

import pytest
from django.contrib.auth.models import User

from runs import services
from runs.events import EventType
from runs.models import Run
from tests.factories import queued_run, running_run
from tests.support.db import token_for
from tests.support.edge import (
    PublishTap,
    complete,
    control_socket,
    edge_env,
    end_the_publishers_connection,
    first_fetches_done,
    link_requests,
    published,
    publishes,
    stack,
    start_edge,
    tapped_stack,
    until_each_has,
    wait_leading,
    watch_all,
    watch_meanwhile,
)
from tests.support.faults import Api, Stats, follow
from tests.support.procs import Procs, free_port, process_gone, wait_log_line
from tests.support.proxies import CuttableProxy, SeenRequest
from tests.support.runs import assert_exact_log, fresh
from tests.support.seed import SEED
from tests.support.sse import Event, Stream, auth_headers, stream_path
from tests.support.threads import in_thread
from tests.support.waiting import wait_until
from tests.support.workers import wait_status

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


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
            # Pushpin fetches the links of a channel's streams a second after its first
            # subscription, by itself (the user's and the link channel's too, `missed`'s first):
            # those come first (`current`'s channel was subscribed last), or they would be taken
            # for the takeover's.
            await asyncio.to_thread(
                wait_until, lambda: first_fetches_done(edge, current, 3), 15, "Pushpin's first fetch of the links"
            )
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
