"""The app's ASGI wrapper around Django's handler (docs/design/deployment.md#web-processes): requests
dispatched by the kind of view (sync views as under WSGI on a fixed pool of threads, async views on
the event loop), the body limit applied before Django spools a body, what a request holds given
back once it ends, static files for a deployment with no web server in front, and the ASGI lifespan.
A project applies it through `runs.asgi.wrap`, which adds the web process's start.
"""

import asyncio
import contextlib
import gc
import json
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.conf import settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core import signals
from django.core.exceptions import RequestAborted, SuspiciousFileOperation
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.http import FileResponse, Http404, HttpRequest, HttpResponseBase
from django.urls import Resolver404, resolve, set_script_prefix

from runs.conf import conf
from runs.http.errors import error_body
from runs.http.middleware import RESOLVED, Phased
from runs.http.request_end import request_ended

Scope = dict[str, Any]

log = logging.getLogger(__name__)


async def _nothing() -> None:
    return None


def wrapper(
    inner: Any,
    *,
    serve_static: bool = False,
    on_startup: Callable[[], object] = lambda: None,
    on_shutdown: Callable[[], Awaitable[None]] = _nothing,
) -> Any:
    """`inner` (the project's `get_asgi_application()`) dispatched by kind of view, behind the body
    limit; `serve_static`: also serve STATIC_URL; `on_startup` and `on_shutdown`: what lives as long
    as the process (the ASGI lifespan)."""
    application: Any = BodyLimit(
        Application(inner, on_startup=on_startup, on_shutdown=on_shutdown), conf.MAX_BODY_BYTES
    )
    return StaticFiles(application) if serve_static else application


class StaticFiles(ASGIStaticFilesHandler):
    """Django's static files handler (the one runserver serves them with): each file under
    STATIC_URL from the app that ships it, found by the STATICFILES_FINDERS
    (docs/design/deployment.md#static-files)."""

    def serve(self, request: HttpRequest) -> FileResponse:
        # A path out of the static folders (/static/../settings.py) is refused by the finders with
        # an exception Django's handler does not catch: a 500 and a traceback. It names no static
        # file: answered as a missing one.
        try:
            return super().serve(request)
        except SuspiciousFileOperation as exc:
            raise Http404("no such static file") from exc


class ResolvedOnce(ASGIHandler):
    def resolve_request(self, request: HttpRequest) -> Any:
        found = getattr(request, "scope", {}).get(RESOLVED)
        if found is None or hasattr(request, "urlconf"):  # a middleware chose another URLconf
            return super().resolve_request(request)
        if isinstance(found, Resolver404):
            raise found
        request.resolver_match = found
        return found


class SyncViews(ResolvedOnce):
    """Sync views as under WSGI: one call per request on a fixed pool of threads."""

    def __init__(self) -> None:
        BaseHandler.__init__(self)
        self.load_middleware(is_async=False)
        self.threads = ThreadPoolExecutor(max_workers=conf.WEB_THREADS, thread_name_prefix="runledger-request")

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        try:
            response = await sync_to_async(self._respond, thread_sensitive=False, executor=self.threads)(
                scope, body_file
            )
            try:
                await self.send_response(response, send)
            finally:
                if response.streaming:
                    await sync_to_async(response.close, thread_sensitive=False, executor=self.threads)()
        finally:
            body_file.close()

    def _respond(self, scope: Scope, body_file: IO[bytes]) -> HttpResponseBase:
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, refused = self.create_request(scope, body_file)
        response = self.get_response(request) if request is not None else refused
        assert response is not None  # create_request answers one or the other
        if not response.streaming:
            # Its content is in memory: end the request here, on the thread that served it.
            response.close()
        return response


class Unanswered(Exception):
    """A response whose 200 has begun cannot answer after all (a wait whose database, caller's sight
    of the run or run is lost): its body is left unfinished, and the client's next try is answered
    as a new request is (503, 401, 404)."""


class AsyncViews(ResolvedOnce):
    """Async views on the event loop, without a thread-sensitive context (and so no thread) each.

    What a view holds for its request (a stream's slot of its user's cap) is given back here, once
    the request has surely ended: a client that leaves before a stream's first byte cancels the
    request anywhere between the view and its body, and a body never started runs no `finally`."""

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async)
        # Their sync middleware in two hops to its thread, not one per method (middleware.py).
        if is_async and (phased := Phased.load(self)) is not None:
            self._middleware_chain = phased

    async def handle(self, scope: Scope, receive: Any, send: Any) -> None:
        """Django 5.2's `ASGIHandler.handle`, but for `request_started`: with the middleware phased,
        their first hop sends it (on the thread it would hop to here, a hop fewer)."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        if not isinstance(self._middleware_chain, Phased):
            await signals.request_started.asend(sender=self.__class__, scope=scope)
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            assert error_response is not None  # create_request answers one or the other
            if isinstance(self._middleware_chain, Phased):
                await signals.request_started.asend(sender=self.__class__, scope=scope)
            body_file.close()
            await self.send_response(error_response, send)
            await sync_to_async(error_response.close)()
            return

        async def process_request(request: HttpRequest, send: Any) -> HttpResponseBase:
            response = await self.run_get_response(request)
            with contextlib.suppress(asyncio.CancelledError):  # the client left during the send
                await self.send_response(response, send)
            return response

        # A disconnect heard while the response is made ends it.
        responding = asyncio.create_task(process_request(request, send))
        tasks: list[asyncio.Task[Any]] = [asyncio.create_task(self.listen_for_disconnect(receive)), responding]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                try:
                    task.result()
                except RequestAborted:
                    pass
                except AssertionError:
                    body_file.close()
                    raise
            else:
                task.cancel()  # the view may handle its cancellation
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        try:
            answered = responding.result()
        except asyncio.CancelledError:
            await signals.request_finished.asend(sender=self.__class__)
        else:
            await sync_to_async(answered.close)()
        body_file.close()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        try:
            await self.handle(scope, receive, send)
        except Unanswered as exc:
            # Its body is left unfinished on purpose: the client asks again.
            log.info("%s: %s", scope["path"], exc)
        finally:
            request_ended(scope)


class Application:
    def __init__(
        self, inner: Any, *, on_startup: Callable[[], object], on_shutdown: Callable[[], Awaitable[None]]
    ) -> None:
        self.inner = inner
        self.on_startup, self.on_shutdown = on_startup, on_shutdown
        self.sync_views = SyncViews()
        self.async_views = AsyncViews()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            views = self.async_views if _is_async_view(scope) else self.sync_views
            await views(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self.lifespan(receive, send)
        else:
            await self.inner(scope, receive, send)

    async def lifespan(self, receive: Any, send: Any) -> None:
        """What lives as long as the process, started and stopped with it."""
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                _fewer_collector_pauses()
                self.on_startup()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.on_shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return


def _fewer_collector_pauses() -> None:
    """Keep the garbage collector's pauses out of the streams' delivery (docs/design/streaming.md#hub):
    what exists once the process has started is out of its sight for good, and the young generation
    collected every 50,000 allocations rather than 700."""
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


def _is_async_view(scope: Scope) -> bool:
    path = scope["path"].removeprefix(scope.get("root_path", "")) or "/"
    try:
        match = resolve(path, settings.ROOT_URLCONF)
    except Resolver404 as exc:
        scope[RESOLVED] = exc  # Django's handler raises it for its 404
        return False
    scope[RESOLVED] = match
    return iscoroutinefunction(match.func)


class BodyLimit:
    """Refuses a body over `limit` bytes before Django reads it (Django's ASGI handler spools the
    whole body to a temporary file before any middleware, and checks its size only when a view
    reads it): a declared Content-Length over the limit at once, a chunked body as soon as it
    passes the limit. For deployments without the proxy, which refuses them first (deploy/).
    The connection is closed with the answer. A declared body up to `LINGER_FACTOR` times the limit
    is read and dropped first, for at most `LINGER_SECONDS` (a lingering close, as nginx's): closed
    with its body unread, the connection would be reset, and a client still sending its body, or a
    proxy between, may lose the answer. Any other body's rest is never read."""

    LINGER_FACTOR = 4
    LINGER_SECONDS = 1.0

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            # Not when the client waits for a 100 Continue before it sends its body.
            if declared.isdigit() and int(declared) <= self.LINGER_FACTOR * self.limit and b"expect" not in headers:
                await self.drop_body(receive)
            return await self.refuse(send)
        seen, over, started = 0, False, False

        async def receive_within_limit() -> dict[str, Any]:
            nonlocal seen, over
            if over:
                return {"type": "http.disconnect"}
            message: dict[str, Any] = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    over = True  # Django drops what it spooled when it hears of the disconnect
                    return {"type": "http.disconnect"}
            return message

        async def send_noting_start(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, receive_within_limit, send_noting_start)
        if over and not started:
            await self.refuse(send)

    async def drop_body(self, receive: Any) -> None:
        """Reads the body and drops it, for at most LINGER_SECONDS."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.LINGER_SECONDS):
                while (message := await receive())["type"] == "http.request" and message.get("more_body"):
                    pass

    async def refuse(self, send: Any) -> None:
        message = "the request body is larger than the server accepts"
        body = json.dumps(error_body("payload_too_large", message, {"limit_bytes": self.limit})).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            # What is left of the body is not read: this connection cannot carry another request.
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})
