"""Database calls from the worker's event loop, on a few dedicated threads.

Django's ORM is synchronous, and each thread has its own connection. The worker keeps a small,
fixed set of threads whose connections live as long as the worker (a claim or a cancellation
re-read does not pay for a new connection), are closed after a connection-level error (so the
next call reconnects) and when the worker stops.

Three lanes keep control traffic (cancellation re-reads, heartbeats, releases) from queueing behind
event appends or a long sweep. On SQLite, where a file has one writer at a time anyway, the lanes
share a single thread, so the worker's own writers never contend for the file lock.

A PostgreSQL restart costs each thread one failed call: the error closes its connection and the
next call connects again, so the worker reconnects by itself once the server is back.
"""

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

from runs.conf import conf

log = logging.getLogger(__name__)

T = TypeVar("T")

# Errors that say "the database could not be reached just now", worth retrying while the lease holds.
TRANSIENT_DB_ERRORS = (OperationalError, InterfaceError)

_Job = tuple[Callable[[], Any], asyncio.Future[Any], asyncio.AbstractEventLoop]


# Marks the lanes' threads, whose connections get the session settings below.
_lane_thread = threading.local()


def _on_connection_created(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    if connection.vendor != "postgresql" or not getattr(_lane_thread, "active", False):
        return
    # A worker stalled or cut off inside a transaction would hold the run's row lock, and with it
    # the sweeper (which skips locked runs) and every command on the run, until its session died.
    # The server ends such a session once it has idled a lease inside a transaction: by then the
    # attempt has stopped itself anyway. The worker's own transactions never idle that long.
    timeout_ms = max(1000, int(conf.LEASE_SECONDS * 1000))
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, false)", [str(timeout_ms)])


connection_created.connect(_on_connection_created, dispatch_uid="runledger-worker-lane-session")


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the caller stopped waiting (it was cancelled)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class DbLane:
    def __init__(self, name: str, threads: int) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._serve, name=f"{name}-{i}", daemon=True) for i in range(max(1, threads))
        ]
        for thread in self._threads:
            thread.start()

    async def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put((lambda: fn(*args, **kwargs), future, loop))
        return await future

    def _serve(self) -> None:
        _lane_thread.active = True
        try:
            while (job := self._queue.get()) is not None:
                fn, future, loop = job
                if future.cancelled():
                    # The caller stopped waiting before the call began (a renewal past its
                    # attempt's fence, say): it no longer wants it made.
                    continue
                result: Any = None
                error: BaseException | None = None
                try:
                    result = fn()
                except BaseException as exc:
                    error = exc
                    if isinstance(exc, TRANSIENT_DB_ERRORS):
                        # The connection may be broken (server restart, network cut): drop it so
                        # the next call on this thread connects afresh.
                        connection.close()
                # RuntimeError: the loop is closed, nobody is waiting any more.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_settle, future, result, error)
        finally:
            connections.close_all()

    def stop(self, timeout: float = 10) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout)
            if thread.is_alive():
                log.warning("database thread %s did not stop within %ss", thread.name, timeout)


CONTROL_THREADS = 2
SWEEP_THREADS = 1
# A claim and the records of a batch's outcomes: short statements, the requests run on the loop.
WEBHOOK_THREADS = 1


def without_pool() -> None:
    """Take this process off the connection pool (call before its first connection).

    The lanes' threads keep their connections for life: they are the worker's own fixed pool, and
    psycopg_pool adds nothing to them but harm. A pool smaller than the lanes starved the last
    ones (a worker with a pool of 2 claimed a run and stalled, with no error); and while the server
    is down, a call waits up to the pool's timeout for a connection instead of being refused at
    once, which held an attempt's writer past the moment its lease told it to stop (its released_at
    fell after its lease had lapsed, in tests/worker/test_pg_restart.py)."""
    settings.DATABASES[DEFAULT_DB_ALIAS]["OPTIONS"].pop("pool", None)


class Db:
    """The worker's lanes: `control` for what cancellation latency and leases depend on, `sweep`
    for the sweeper, `webhooks` for webhook deliveries, `work` for the rest."""

    def __init__(self, *, work_threads: int) -> None:
        self.sqlite = connection.vendor == "sqlite"
        if self.sqlite:
            self.work = self.control = self.sweep = self.webhooks = DbLane("runledger-db", 1)
        else:
            self.work = DbLane("runledger-db-work", work_threads)
            self.control = DbLane("runledger-db-control", CONTROL_THREADS)
            self.sweep = DbLane("runledger-db-sweep", SWEEP_THREADS)
            self.webhooks = DbLane("runledger-db-webhooks", WEBHOOK_THREADS)

    def stop(self) -> None:
        for lane in {id(lane): lane for lane in (self.work, self.control, self.sweep, self.webhooks)}.values():
            lane.stop()
