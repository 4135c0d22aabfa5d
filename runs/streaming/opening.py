"""The few threads that open streams and waits, and the breaker that answers 503 at once while the
database fails them (docs/design/streaming.md#opening).

Every check a stream, a wait or the edge's connect makes before it holds the client, the guard's
re-checks and the wait's final read run here, off the event loop and never behind the live reads.
"""

import asyncio
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connection
from django.http import HttpResponse

from runs.http.errors import error_response

T = TypeVar("T")
P = ParamSpec("P")

# A few threads: a reconnect storm of hundreds of clients queues here instead of opening hundreds
# of connections at once (docs/design/streaming.md#opening).
_executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="runledger-sse-open")

# When a call last failed on the database (monotonic), and the calls waiting for their turn, woken
# when one does.
_failed_at = -math.inf
_in_line: set["asyncio.Future[None]"] = set()


def bound() -> float:
    """Seconds a call may take once it runs: a connect timeout for the call itself, and a little more."""
    options = connection.settings_dict.get("OPTIONS", {})
    return float(options.get("connect_timeout", options.get("timeout", 3))) + 2.0


def _failed() -> None:
    """A call failed on the database: from now on (for a bound) calls wait their turn only as long
    as their bound, and those in line give up at once."""
    global _failed_at
    _failed_at = time.monotonic()
    for waiting in list(_in_line):
        waiting.get_loop().call_soon_threadsafe(_wake, waiting)


def _wake(waiting: "asyncio.Future[None]") -> None:
    if not waiting.done():
        waiting.set_result(None)


async def call(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn` on the opening threads, which close the connection it used, bounded by `bound()` from
    when it starts: TimeoutError past it.

    While the database answers, a call waits its turn however long the line (a herd of connects is
    answered, each in turn). While it does not (a call failed on it within a bound), each call in
    line gives up at once and a new one waits at most its bound, turn included. A call given up
    before its turn never runs."""
    loop = asyncio.get_running_loop()
    started: asyncio.Future[None] = loop.create_future()

    def run() -> T:
        loop.call_soon_threadsafe(_wake, started)
        try:
            return fn(*args, **kwargs)
        except DatabaseError:
            _failed()
            raise
        finally:
            # Streams live long; the connection a call used must not live with them.
            connection.close()

    work = asyncio.ensure_future(sync_to_async(run, thread_sensitive=False, executor=_executor)())
    limit = bound()
    try:
        if time.monotonic() - _failed_at > limit:
            failing: asyncio.Future[None] = loop.create_future()
            _in_line.add(failing)
            try:
                await asyncio.wait((started, work, failing), return_when=asyncio.FIRST_COMPLETED)
            finally:
                _in_line.discard(failing)
            if not started.done() and not work.done():
                raise TimeoutError("the database failed a call while this one waited its turn")
        try:
            async with asyncio.timeout(limit):
                return await work
        except TimeoutError:
            _failed()  # a call that hangs: the database may not answer
            raise
    finally:
        work.cancel()  # a call given up before its turn never runs


async def answer(fn: Callable[P, T | HttpResponse], *args: P.args, **kwargs: P.kwargs) -> T | HttpResponse:
    """`call(fn, ...)`, or the 503 that refuses the request when the database fails it."""
    try:
        return await call(fn, *args, **kwargs)
    except (DatabaseError, TimeoutError):
        return unavailable()


def answer_here(fn: Callable[P, T | HttpResponse], *args: P.args, **kwargs: P.kwargs) -> T | HttpResponse:
    """`answer` for a call already on the opening threads (`call`'s own `fn` runs it): `fn(...)`, or
    the 503 when the database fails it, the failure noted as `call` notes it."""
    try:
        return fn(*args, **kwargs)
    except DatabaseError:
        _failed()
        return unavailable()


def unavailable() -> HttpResponse:
    return error_response(503, "database_unavailable", "the database is unavailable; retry later")
