"""Real threads against the database: each on its own connection, closed when it is done."""

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from types import TracebackType
from typing import Any, TypeVar

from django.contrib.auth.models import User
from django.db import connection, transaction

from runs import services
from runs.models import Run
from tests.support.db import waiting_on_a_lock
from tests.support.waiting import wait_until

T = TypeVar("T")


def race(n: int, target: Callable[[int], Any]) -> list[Any]:
    """Run `target(i)` in n real threads, each on its own database connection, released together.

    Returns each thread's result, or the exception it raised.
    """
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def body(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = target(i)
        except BaseException as exc:  # the caller inspects what each thread met
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
        assert not t.is_alive(), "a racing thread hung"
    return results


def race_a_cancel(n: int, run: Run, actor: User, other: Callable[[], Any]) -> list[Any]:
    """`race`: thread 0 cancels `run` as `actor` while the n - 1 others each call `other`."""
    return race(n, lambda i: services.run_cancel(run_id=run.pk, actor=actor) if i == 0 else other())


def in_thread(fn: Callable[[], Any]) -> Callable[[], Any]:
    """`fn` for asyncio.to_thread: the database from another thread, closed after use."""

    def run() -> Any:
        try:
            return fn()
        finally:
            connection.close()

    return run


class DbThread:
    """One thread for a test's database work while its main thread runs an event loop (where the
    ORM may not run). Its connection opens with the first call and is kept until the `with` block
    ends: however many calls it serves, the test adds one session to the server, not one a call."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-db")

    def call(self, fn: Callable[[], T], timeout: float = 60) -> T:
        return self._executor.submit(fn).result(timeout=timeout)

    async def run(self, fn: Callable[[], T]) -> T:
        return await asyncio.wrap_future(self._executor.submit(fn))

    def __enter__(self) -> "DbThread":
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            self.call(lambda: connection.close())
        finally:
            self._executor.shutdown()


def first_holds_second_waits(
    first: Callable[[], object], second: Callable[[], object], meanwhile: Callable[[], object] = lambda: None
) -> None:
    """`first` in a transaction held open; `second` started meanwhile must wait for a lock (on
    PostgreSQL), then `meanwhile` runs while it waits, and both must succeed once `first` commits."""
    done, release = threading.Event(), threading.Event()

    def holding() -> None:
        with transaction.atomic():
            first()
            done.set()
            assert release.wait(30)

    with ThreadPoolExecutor(max_workers=2) as pool:
        held = pool.submit(in_thread(holding))
        assert done.wait(30) or held.result()
        waiting = pool.submit(in_thread(second))
        try:
            wait_until(waiting_on_a_lock, timeout=10, what="the second transaction waiting for the first's lock")
            meanwhile()
        finally:
            release.set()
        held.result(timeout=30)
        waiting.result(timeout=30)


@contextmanager
def rows_held(*run_ids: Any) -> Iterator[None]:
    """The runs `run_ids` locked as a claim in flight locks the run it takes (FOR NO KEY UPDATE) by
    another connection's open transaction while the block runs; released as it ends."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with transaction.atomic():
            assert len(Run.objects.select_for_update(no_key=True).filter(pk__in=run_ids)) == len(run_ids)
            held.set()
            assert release.wait(30)

    with ThreadPoolExecutor(max_workers=1) as pool:
        holder = pool.submit(in_thread(hold))
        try:
            assert held.wait(30) or holder.result()
            yield
        finally:
            release.set()
            holder.result(timeout=30)
