"""Real threads against the database: each on its own connection, closed when it is done."""

import threading
from collections.abc import Callable
from typing import Any

from django.db import connection


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


def in_thread(fn: Callable[[], Any]) -> Callable[[], Any]:
    """`fn` for asyncio.to_thread: the database from another thread, closed after use."""

    def run() -> Any:
        try:
            return fn()
        finally:
            connection.close()

    return run
