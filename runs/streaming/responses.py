"""How a stream and a wait answer, under any server (docs/design/streaming.md#servers): a response
that gives its user's slot back when closed (`WatchedResponse`), and both views served by a WSGI
server such as `runserver` on one event loop the process keeps (`served_under_wsgi`).
"""

import asyncio
import concurrent.futures
import contextvars
import functools
import logging
import os
import threading
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

from django.http import HttpRequest, HttpResponseBase, StreamingHttpResponse

from runs.http.asgi import Unanswered
from runs.http.errors import error_response
from runs.http.request_end import request_ended
from runs.streaming.guard import Watch

log = logging.getLogger(__name__)

T = TypeVar("T")
View = Callable[..., Coroutine[Any, Any, HttpResponseBase]]

# How long closing a response under WSGI waits for its body to close on the loop.
CLOSE_SECONDS = 10.0


class WatchedResponse(StreamingHttpResponse):
    """A stream's (or a wait's) answer: gives its slot back when closed, as Django's own handler
    closes a response it sent or began to send, however the client left. Made without them, it is
    the head a stream's opening makes before its slot is taken (views.py), `watched` after."""

    watch: Watch | None = None

    def __init__(
        self, watch: Watch | None = None, body: AsyncGenerator[bytes, None] | None = None, **kwargs: Any
    ) -> None:
        super().__init__((), **kwargs)
        if watch is not None and body is not None:
            self.watched(watch, body)

    def watched(self, watch: Watch, body: AsyncGenerator[bytes, None]) -> "WatchedResponse":
        self.watch, self.body = watch, body
        self.streaming_content = body
        return self

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.watch is not None:
                self.watch.release()


def served_under_wsgi(view: View) -> View:
    """`view`, an async view of a stream or a wait, served on the process's stream loop when the
    request came through a WSGI server (an ASGI request has a scope, and is on its server's loop)."""

    @functools.wraps(view)
    async def served(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if hasattr(request, "scope"):
            return await view(request, *args, **kwargs)
        # The request's context goes with it: the URLconf and script prefix Django set for it.
        answered = _on_loop(_answer(view, request, args, kwargs), contextvars.copy_context())
        return await asyncio.wrap_future(answered)

    return served


_loop_lock = threading.Lock()
_loop: tuple[int, asyncio.AbstractEventLoop] | None = None


def _stream_loop() -> asyncio.AbstractEventLoop:
    """This process's loop for streams under WSGI, started with the first (a forked child starts its own)."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="runledger-streams", daemon=True).start()
            _loop = (os.getpid(), loop)
        return _loop[1]


def _on_loop(
    coro: Coroutine[Any, Any, T], context: contextvars.Context | None = None
) -> "concurrent.futures.Future[T]":
    """`coro` as a task on the stream loop, in `context` (the loop thread's own if None)."""
    done: concurrent.futures.Future[T] = concurrent.futures.Future()
    loop = _stream_loop()

    def settle(task: "asyncio.Task[T]") -> None:
        if task.cancelled():
            done.cancel()
        elif (exc := task.exception()) is not None:
            done.set_exception(exc)
        else:
            done.set_result(task.result())

    def start() -> None:
        loop.create_task(coro, context=context).add_done_callback(settle)

    loop.call_soon_threadsafe(start)
    return done


async def _answer(view: View, request: HttpRequest, args: tuple[Any, ...], kwargs: dict[str, Any]) -> HttpResponseBase:
    """On the stream loop: the view's answer, and a stream's or wait's first chunk with it.

    The first chunk is read here because a WSGI server sends nothing before it: the head of a wait
    that cannot answer after all has not gone yet, so it is answered with a 503 to retry (under
    ASGI its body is left unfinished, which a WSGI server's bodies, ended by closing the
    connection, cannot say)."""
    relayed = False
    try:
        response = await view(request, *args, **kwargs)
        if not isinstance(response, WatchedResponse):
            return response
        try:
            first = await anext(response.body, b"")
        except Unanswered as exc:
            log.info("%s: %s", request.path, exc)
            return error_response(503, "wait_unanswered", "the wait could not answer after all; ask again")
        relayed = True
        return _Relayed(response, first, request)
    finally:
        if not relayed:
            request_ended(request.META)


class _Relayed(StreamingHttpResponse):
    """A stream's or a wait's answer under WSGI: its body pulled from the stream loop chunk by
    chunk; closed there, with what the view registered for the request's end."""

    def __init__(self, response: WatchedResponse, first: bytes, request: HttpRequest) -> None:
        super().__init__(_pulled(first, response.body), status=response.status_code, headers=response.headers)
        self.cookies = response.cookies
        self.relayed = response
        self.request_environ = request.META

    def close(self) -> None:
        try:
            _on_loop(_closed(self.relayed.body, self.request_environ)).result(timeout=CLOSE_SECONDS)
        finally:
            # Django's own: the request's end (request_finished), on the server's thread.
            super().close()


def _pulled(first: bytes, body: AsyncGenerator[bytes, None]) -> Iterator[bytes]:
    yield first
    while (chunk := _on_loop(_next(body)).result()) is not None:
        yield chunk


async def _next(body: AsyncGenerator[bytes, None]) -> bytes | None:
    """The body's next chunk, None at its end (a task cannot end with StopAsyncIteration's meaning)."""
    try:
        return await anext(body)
    except StopAsyncIteration:
        return None


async def _closed(body: AsyncGenerator[bytes, None], environ: dict[str, Any]) -> None:
    try:
        await body.aclose()  # a body its client left: its `finally` gives the slot back
    finally:
        request_ended(environ)
