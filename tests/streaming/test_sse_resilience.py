"""SSE streams survive any disconnect: real uvicorn processes, a writer in a third
process, real sockets that drop at random points.

The randomness is seeded; the seed is printed (shown with a failure) and can be replayed with
RUNLEDGER_TEST_SEED=<seed>.
"""

import asyncio
import os
import random

import pytest
from django.conf import settings
from django.contrib.auth.models import User

from runs import services
from runs.events import TERMINAL_EVENT_TYPES
from runs.models import Run, RunAttempt
from tests.factories import running_run
from tests.support.db import event_table_reads, listen_pids, query_one, token_for
from tests.support.procs import (
    UNCAPPED,
    Proc,
    Procs,
    connections_to,
    start_writer,
    subprocess_env,
    threads_of,
    web_env,
)
from tests.support.runs import assert_exact_log
from tests.support.seed import SEED
from tests.support.sse import Event, Stream, auth_headers, stream_path, watch
from tests.support.threads import in_thread
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

ON_POSTGRESQL = not os.environ.get("DATABASE_URL", "").startswith("sqlite")


# --- a client that drops its connection at random points ---------------------------------------


def drop_budget(rng: random.Random) -> int:
    """How many body bytes the next connection gets before it dies: often during the first
    frame (or before it), otherwise anywhere in the next few frames; always mid-frame-capable."""
    return rng.randint(0, 60) if rng.random() < 0.25 else rng.randint(0, 1300)


async def reassemble(
    web: Proc, run: Run, token: str, rng: random.Random, writer: Proc
) -> tuple[list[Event], int, int, int]:
    """Read the run to its end through connections that drop at random byte offsets, reconnecting
    each time with the last *dispatched* event id. Returns (events, drops, drops while the writer
    was still appending, the final reconnect's status)."""
    got: list[Event] = []
    last_id: str | None = None
    drops = drops_while_writing = 0
    for _ in range(5000):
        stream = await Stream(web.url, stream_path(run), auth_headers(token, last_id)).open()
        assert stream.status == 200, (stream.status, stream.body)
        async for event in stream.events(byte_budget=drop_budget(rng)):
            got.append(event)
        stream.close()
        last_id = stream.parser.last_event_id or last_id
        if stream.dropped:
            drops += 1
            drops_while_writing += writer.popen.poll() is None
        if got and got[-1].event in TERMINAL_EVENT_TYPES:
            break
    final = await Stream(web.url, stream_path(run), auth_headers(token, last_id)).open()
    return got, drops, drops_while_writing, final.status


@pytest.mark.sqlite
def test_random_drops_with_last_event_id_reconnects_reassemble_the_exact_log(procs: Procs, alice: User) -> None:
    print(f"seed {SEED}")
    rng = random.Random(SEED)
    web = procs.uvicorn()
    token = token_for(alice)
    total_drops = total_while_writing = rounds = 0
    while total_drops < 200 and rounds < 4:
        run = running_run(alice)
        writer = start_writer(procs, run, count=300, seed=SEED + rounds, pause_ms=15)
        events, drops, while_writing, final = asyncio.run(
            asyncio.wait_for(reassemble(web, run, token, rng, writer), 90)
        )
        writer.wait_exit()
        run.refresh_from_db()
        assert run.status == "completed"
        assert_exact_log(events, run)
        assert final == 204  # the finished run, read to its end: EventSource would stop here
        print(f"round {rounds}: {len(events)} events, {drops} drops ({while_writing} while the writer appended)")
        total_drops += drops
        total_while_writing += while_writing
        rounds += 1
    assert total_drops >= 200, f"seed {SEED}"
    assert total_while_writing >= 10, f"seed {SEED}"


# --- many watchers, one process ------------------------------------------------------------------


@pytest.mark.sqlite
def test_200_watchers_of_one_run_on_one_web_process_all_receive_every_event_in_order(procs: Procs, alice: User) -> None:
    web = procs.uvicorn(env=web_env("sse-many-web", **UNCAPPED))
    token = token_for(alice)
    run = running_run(alice)
    n = 200
    measured: dict[str, int] = {}

    async def scenario() -> list[list[Event]]:
        connected = [asyncio.Event() for _ in range(n)]
        watchers = [
            asyncio.create_task(watch(web.url, stream_path(run), auth_headers(token), connected=c, timeout=90))
            for c in connected
        ]
        await asyncio.wait_for(asyncio.gather(*(c.wait() for c in connected)), 60)
        if ON_POSTGRESQL:
            # n open, idle streams: the web process's own connections (LISTEN has its own name)
            # are at most its two small pools', never one per stream.
            measured["connections"] = await asyncio.to_thread(
                in_thread(
                    lambda: query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", ["sse-many-web"]
                    )
                )
            )
            measured["reads_before"] = await asyncio.to_thread(in_thread(event_table_reads))
        writer = start_writer(procs, run, count=200, seed=SEED, pause_ms=5)
        results = await asyncio.gather(*watchers)
        await asyncio.to_thread(writer.wait_exit)
        if ON_POSTGRESQL:
            measured["reads_after"] = await asyncio.to_thread(in_thread(event_table_reads))
        return results

    results = asyncio.run(scenario())
    run.refresh_from_db()
    assert run.status == "completed"
    assert len(results) == n
    for events in results:
        assert_exact_log(events, run)
    if ON_POSTGRESQL:
        live_reads = measured["reads_after"] - measured["reads_before"]
        print(f"{n} watchers: {measured['connections']} connections while idle, {live_reads} event reads live")
        # The web process's pool and its LISTEN connection, however many watchers: a busy machine
        # makes the pool grow to its size while the opens queue, never beyond.
        assert measured["connections"] <= settings.DEFAULT_DB_POOL_SIZE + 1
        # Shared reads: at most one per wake-up of the run (a commit's notification or a poll
        # tick), whatever the number of watchers; one read per watcher would be 200 times that.
        assert live_reads <= run.last_seq + 30


# --- several processes, a killed LISTEN connection ------------------------------------------------


def test_two_web_processes_see_every_event_and_a_killed_listen_connection_loses_nothing(
    procs: Procs, alice: User
) -> None:
    # PostgreSQL only (not marked sqlite): LISTEN/NOTIFY is what it tests.
    print(f"seed {SEED}")
    # A poll too long to matter, so delivery here rests on NOTIFY and on the wake-up after the
    # listener reconnects: were either missing, the watchers would stall until the deadline. The
    # reconnect is slowed down so that commits can land while no listener is connected.
    env = subprocess_env(RUNLEDGER_POLL_SECONDS="300", RUNLEDGER_LISTEN_RECONNECT_SECONDS="2")
    webs = [procs.uvicorn(env=env), procs.uvicorn(env=env)]
    names = {f"runledger-listen:web:{web.pid}" for web in webs}
    token = token_for(alice)
    run = running_run(alice)
    checks: dict[str, bool] = {}

    def kill_listeners() -> dict[str, int]:
        before = listen_pids()
        query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name LIKE 'runledger-listen:web:%%' AND datname = current_database()",
            [],
        )
        return before

    def listening_again(before: dict[str, int]) -> bool:
        now = listen_pids()
        return now.keys() == before.keys() and all(now[k] != before[k] for k in now)

    async def scenario() -> list[list[Event]]:
        progress: list[list[Event]] = [[] for _ in range(6)]
        connected = [asyncio.Event() for _ in progress]
        watchers = [
            asyncio.create_task(
                watch(webs[i % 2].url, stream_path(run), auth_headers(token), connected=c, got=g, timeout=90)
            )
            for i, (c, g) in enumerate(zip(connected, progress, strict=True))
        ]
        await asyncio.wait_for(asyncio.gather(*(c.wait() for c in connected)), 30)
        await asyncio.to_thread(in_thread(lambda: wait_until(lambda: set(listen_pids()) == names, 20, "both listen")))

        # 1. The writer, a third process, appends while both listening connections are killed.
        writer = start_writer(procs, run, count=300, seed=SEED, pause_ms=20, max_batch=2, complete=False)
        while min(len(g) for g in progress) < 60:
            await asyncio.sleep(0.02)  # polling the watchers' progress
        before = await asyncio.to_thread(in_thread(kill_listeners))
        checks["killed while the writer appended"] = writer.popen.poll() is None
        await asyncio.to_thread(
            in_thread(lambda: wait_until(lambda: listening_again(before), 20, "both processes listen again"))
        )
        await asyncio.to_thread(writer.wait_exit)

        # 2. The last events, and the run's end, commit while nobody listens and nothing follows
        # them: only the wake-up on reconnect can bring them to the watchers.
        def end_during_outage() -> None:
            before = kill_listeners()
            wait_until(lambda: not listen_pids(), 10, "the killed connections are gone")
            run.refresh_from_db()
            services.run_events_append(run_id=run.pk, generation=run.generation, events=[("output.delta", {})])
            services.run_complete(run_id=run.pk, generation=run.generation, output={"ok": True})
            checks["ended while no listener was connected"] = not listen_pids()
            wait_until(lambda: listening_again(before), 20, "both processes listen again")

        await asyncio.to_thread(in_thread(end_during_outage))
        return await asyncio.wait_for(asyncio.gather(*watchers), 60)

    results = asyncio.run(scenario())
    assert checks == {"killed while the writer appended": True, "ended while no listener was connected": True}
    run.refresh_from_db()
    assert run.status == "completed"
    for events in results:
        assert_exact_log(events, run)


# --- disconnects never change the run -------------------------------------------------------------


@pytest.mark.sqlite
def test_disconnecting_every_watcher_leaves_the_run_running_to_completion(procs: Procs, alice: User) -> None:
    web = procs.uvicorn(env=subprocess_env(**UNCAPPED))
    token = token_for(alice)
    run = running_run(alice)
    services.run_events_append(
        run_id=run.pk, generation=run.generation, events=[("output.delta", {"text": str(i)}) for i in range(5)]
    )
    baseline_threads, port = threads_of(web.pid), int(web.port or 0)
    n = 30

    async def open_and_drop_all() -> tuple[int, int]:
        streams = [await Stream(web.url, stream_path(run), auth_headers(token)).open() for _ in range(n)]
        for stream in streams:
            async for event in stream.events():
                if event.seq == 7:
                    break
        # The server holds every stream (a connection each) and no thread for any of them: what
        # threads there are belong to the hub's two pools of at most 4 (runs/streaming/hub.py).
        peak = threads_of(web.pid), connections_to(port)
        for stream in streams:
            stream.abort()
        return peak

    peak_threads, peak_connections = asyncio.run(asyncio.wait_for(open_and_drop_all(), 60))
    assert peak_connections >= n
    assert peak_threads <= baseline_threads + 9
    # The server noticed every disconnect and ended every stream.
    wait_until(lambda: connections_to(port) == 0, 20, "the web process released the streams")

    run.refresh_from_db()
    attempt = RunAttempt.objects.get(run=run, generation=run.generation)
    assert (run.status, run.end_code, run.ended_at, run.last_seq) == ("running", "", None, 7)
    assert (attempt.outcome, attempt.released_at) == ("", None)

    # The run goes on: more output, then its natural end, which a returning watcher sees.
    services.run_events_append(run_id=run.pk, generation=run.generation, events=[("output.delta", {"text": "more"})])
    services.run_complete(run_id=run.pk, generation=run.generation, output={"ok": True})
    run.refresh_from_db()
    assert run.status == "completed"
    rest = asyncio.run(watch(web.url, stream_path(run), auth_headers(token, "7"), timeout=30))
    assert_exact_log(rest, run, after=7)
    assert [e.event for e in rest] == ["output.delta", "run.completed"]
