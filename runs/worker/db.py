"""Database calls from the worker's event loop, on a few dedicated threads in lanes
(docs/design/deployment.md#connections): `control` (cancellation re-reads, heartbeats, releases),
`sweep`, `webhooks` and `work`, so control traffic never queues behind appends or a long sweep.
Each thread keeps its connection for the worker's life and drops it after a connection-level
error, so the worker reconnects by itself after a PostgreSQL restart; on SQLite the lanes share one
thread, the file's one writer.
"""

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, Error, InterfaceError, OperationalError, connection, connections
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
            if connection.vendor == "postgresql" and connection.connection is not None:
                # Pooled (a worker run in-process, as the tests do), the session outlives the lane:
                # it goes back without the lane's bound. `runworker` runs without a pool.
                with contextlib.suppress(Error), connection.cursor() as cursor:
                    cursor.execute("RESET idle_in_transaction_session_timeout")
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
# The scheduler's fires, one transaction after another (docs/design/schedules.md#scheduler).
SCHEDULE_THREADS = 1


def without_pool() -> None:
    """Take this process off the connection pool, at its start (`runworker`), before its first
    connection: the lanes' threads keep theirs for life (docs/design/deployment.md#connections)."""
    settings.DATABASES[DEFAULT_DB_ALIAS]["OPTIONS"].pop("pool", None)


class Db:
    """The worker's lanes: `control` for what cancellation latency and leases depend on, `sweep`
    for the sweeper, `webhooks` for webhook deliveries, `schedules` for the scheduler, `work` for
    the rest."""

    def __init__(self, *, work_threads: int) -> None:
        # Here, when a worker starts, not at import: only the lanes' connections get the setting.
        connection_created.connect(_on_connection_created, dispatch_uid="runledger-worker-lane-session")
        self.sqlite = connection.vendor == "sqlite"
        if self.sqlite:
            self.work = self.control = self.sweep = self.webhooks = self.schedules = DbLane("runledger-db", 1)
        else:
            self.work = DbLane("runledger-db-work", work_threads)
            self.control = DbLane("runledger-db-control", CONTROL_THREADS)
            self.sweep = DbLane("runledger-db-sweep", SWEEP_THREADS)
            self.webhooks = DbLane("runledger-db-webhooks", WEBHOOK_THREADS)
            self.schedules = DbLane("runledger-db-schedules", SCHEDULE_THREADS)

    def stop(self) -> None:
        lanes = (self.work, self.control, self.sweep, self.webhooks, self.schedules)
        for lane in {id(lane): lane for lane in lanes}.values():
            lane.stop()
