"""A web process borrows its PostgreSQL connections from a pool (config/settings.py,
RUNLEDGER_DB_POOL_SIZE) and reuses a few of them for any number of requests and streams; a worker
keeps one connection per database thread for life instead (runs/worker/db.py), so no pool size
starves it.

PostgreSQL only (no test here is marked `sqlite`): SQLite has no pool and no sessions to count.
The server counts every session it starts (pg_stat_database.sessions), so a web process that
opened connections instead of borrowing them shows in that count, whatever its connections'
names. The test's own database work runs on the main thread's connection and on one `DbThread`,
both opened before the count starts: what the count grows by is the web process's alone, its
pool's connections and the LISTEN connection it opens with its first stream.
"""

import asyncio
import contextlib
import re

import pytest
from django.contrib.auth.models import User
from django.db import connection

from config.settings import DEFAULT_DB_POOL_SIZE
from runs import services
from runs.events import EventType
from runs.models import Run
from tests.factories import queued_run, running_run
from tests.support.db import connections_named, listen_connections, query_one, sessions_settled, token_for
from tests.support.faults import request, token_header
from tests.support.pg import PgCluster
from tests.support.procs import UNCAPPED, Proc, Procs, connections_to, subprocess_env, wait_http_ok, web_env
from tests.support.runs import assert_exact_log
from tests.support.sse import Stream, auth_headers, stream_path, watch
from tests.support.threads import DbThread
from tests.support.waiting import wait_until
from tests.support.workers import wait_status

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

POOLED = "runledger-pooltest"
UNPOOLED = "runledger-nopooltest"

_LOGGED = re.compile(r"(?:statement|execute [^:\s]+): (.*)")


def append(run: Run, n: int) -> None:
    events = [(EventType.OUTPUT_DELTA, {"text": f"delta {i}"}) for i in range(n)]
    services.run_events_append(run_id=run.pk, generation=run.generation, events=events)


async def plain_requests(web: Proc, run: Run, token: str, n: int, at_once: int = 8) -> list[int]:
    """`n` API reads of the run (its detail and its events, in turn), `at_once` in flight: their statuses."""
    paths = [f"/api/runs/{run.pk}/", f"/api/runs/{run.pk}/events/"]
    gate = asyncio.Semaphore(at_once)

    async def one(i: int) -> int:
        async with gate:
            return (await request(web.url, "GET", paths[i % 2], headers=token_header(token))).status

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def read_first_event(web: Proc, run: Run, token: str) -> Stream:
    stream = await Stream(web.url, stream_path(run), auth_headers(token)).open()
    assert stream.status == 200, (stream.status, stream.body)
    async for _ in stream.events():
        break
    return stream


def idle_in_transaction(application_name: str) -> int:
    return int(
        query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND state LIKE 'idle in transaction%%'",
            [application_name],
        )
    )


def test_the_web_process_reuses_pooled_connections_and_survives_aborted_streams(procs: Procs, alice: User) -> None:
    web = procs.uvicorn(env=web_env(POOLED, **UNCAPPED))
    token = token_for(alice)
    run = running_run(alice)
    append(run, 5)
    port = int(web.port or 0)

    async def abort_streams_while_appending(db: DbThread) -> int:
        """Three rounds of 60 streams, each read to its first event and then reset, while events
        are appended to the run: how many were appended."""
        stop = asyncio.Event()

        async def writer() -> int:
            appended = 0
            while not stop.is_set():
                await db.run(lambda: append(run, 2))
                appended += 2
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.02):  # pacing the writer, not synchronising
                        await stop.wait()
            return appended

        writing = asyncio.create_task(writer())
        try:
            for _ in range(3):
                streams = await asyncio.gather(*(read_first_event(web, run, token) for _ in range(60)))
                for stream in streams:
                    stream.abort()  # RST: the server learns of it only from its socket
        finally:
            stop.set()
        return await writing

    with DbThread() as db:
        db.call(lambda: connection.ensure_connection())
        # The pool opens with the first request that needs the database, with its first two
        # connections: counted before, they do not pass for new ones.
        wait_http_ok(web, "/readyz/")
        wait_until(lambda: connections_named(POOLED) >= 2, 10, "the web process's pool opened")
        before = sessions_settled()
        appended = asyncio.run(asyncio.wait_for(abort_streams_while_appending(db), 30))
        wait_until(lambda: connections_to(port) == 0, 10, "the web process dropped every aborted stream")
        statuses = asyncio.run(asyncio.wait_for(plain_requests(web, run, token, 300), 30))
        grown = sessions_settled() - before

    print(f"{appended} events appended while 180 streams were aborted; 300 requests; {grown} new sessions")
    assert appended > 0
    # No 503: an exhausted pool would have made requests wait out its timeout, then fail.
    assert statuses == [200] * 300, sorted(set(statuses))
    # The pool's connections (never more than its size), the LISTEN connection, one to spare.
    assert grown <= DEFAULT_DB_POOL_SIZE + 2
    assert idle_in_transaction(POOLED) == 0
    assert connections_named(POOLED) <= DEFAULT_DB_POOL_SIZE
    assert "rolling back returned connection" not in web.log(), web.log()

    # And streams are still served: a new watcher gets the whole log to the run's end.
    services.run_complete(run_id=run.pk, generation=run.generation, output={"ok": True})
    run.refresh_from_db()
    assert_exact_log(asyncio.run(watch(web.url, stream_path(run), auth_headers(token), timeout=20)), run)


def test_without_the_pool_every_request_starts_a_session(procs: Procs, alice: User) -> None:
    # What the pool saves, and proof that the count above would see connections opened per request.
    web = procs.uvicorn(env=web_env(UNPOOLED, RUNLEDGER_DB_POOL_SIZE="0"))
    token = token_for(alice)
    run = running_run(alice)
    before = sessions_settled()
    statuses = asyncio.run(asyncio.wait_for(plain_requests(web, run, token, 100), 30))
    grown = sessions_settled() - before
    print(f"100 requests without a pool: {grown} new sessions")
    assert statuses == [200] * 100
    assert grown >= 100


def test_a_worker_never_borrows_from_the_pool_so_no_pool_size_starves_it(procs: Procs, alice: User) -> None:
    # Concurrency 4: four work threads, two control threads and a sweep thread, each keeping its
    # connection for life. With a pool of 2 for them all, a worker used to claim a run and stall.
    procs.worker("w2", concurrency=4, env=subprocess_env(RUNLEDGER_DB_POOL_SIZE="2"))
    runs = [queued_run(alice, input={"deltas": 5, "delay_ms": 5}) for _ in range(6)]
    for run in runs:
        wait_status(run, "completed", timeout=30)


LOGGED = "runledger-loggedtest"


@pytest.mark.pg_cluster
def test_a_pooled_read_sends_only_its_own_statements_and_a_restart_costs_each_idle_connection_one_503(
    procs: Procs, alice: User, pg_cluster: PgCluster
) -> None:
    """No check of a lent connection (config/settings.py, docs/design/deployment.md#connections): the
    server's log of the web process's statements holds a read's own two and no empty one. Across a
    PostgreSQL restart, each connection idle in the pool fails the one request that draws it (a 503)
    and is replaced; every request after those is served."""
    # Only this web process's sessions log their statements (libpq's `options`, from the URL's query).
    web = procs.uvicorn(env=web_env(LOGGED + "&options=-c%20log_statement%3Dall", **UNCAPPED))
    token, run = token_for(alice), queued_run(alice)
    log = pg_cluster.root / "server.log"

    def reads(n: int) -> list[int]:
        return [
            asyncio.run(request(web.url, "GET", f"/api/runs/{run.pk}/", headers=token_header(token))).status
            for _ in range(n)
        ]

    assert reads(5) == [200] * 5  # the pool opens; the token's last use is noted
    start = log.stat().st_size

    def logged() -> list[str]:
        with log.open("rb") as file:
            file.seek(start)
            text = file.read().decode(errors="replace")
        # A statement sent whole logs as "statement: …", a prepared one as "execute <name>: …"
        return [found[1].strip() for line in text.splitlines() if (found := _LOGGED.search(line))]

    # The token is answered from the process's token cache (docs/design/api.md#token-cache) once
    # its listener is up: each read then sends its run's read alone.
    wait_until(lambda: listen_connections("tokens"), 10, "the token cache's listener")
    assert reads(10) == [200] * 10

    def run_reads() -> int:
        return sum(sql.startswith('SELECT "runs_run"') for sql in logged())

    wait_until(lambda: run_reads() >= 10, 10, "the reads' statements in the server's log")
    kinds = [" ".join(sql.split()[:2]) for sql in logged()]
    tokens = len(kinds) - 10  # read while the listener was connecting: at most the first
    token_read, run_read = 'SELECT "runs_apitoken"."id",', 'SELECT "runs_run"."id",'
    assert tokens <= 1 and kinds == [token_read, run_read] * tokens + [run_read] * (10 - tokens), kinds

    pg_cluster.stop()
    pg_cluster.start()
    statuses: list[int] = []

    def served_again() -> bool:
        statuses.extend(reads(1))
        return statuses[-3:] == [200] * 3

    wait_until(served_again, 30, "reads served again after the restart")
    failed = statuses.index(200)
    assert statuses == [503] * failed + [200] * (len(statuses) - failed), statuses
    assert failed <= DEFAULT_DB_POOL_SIZE
    print(f"after the restart: {failed} requests answered 503 (one per idle pooled connection), then served")
