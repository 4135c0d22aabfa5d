"""The app's ASGI wrapper, for a project's `asgi.py` (the standalone site's config/asgi.py uses it):

    from django.core.asgi import get_asgi_application
    from runs.asgi import wrap

    application = wrap(get_asgi_application())

Nothing in it is needed for correctness: under the stock handler a stream still gives its slot
back however early its client leaves (runs.streaming.guard), and the edge's publisher starts with
the process's first stream request (runs.streaming.edge.publisher). What it adds:

- **Requests dispatched by the kind of view.** Django's own ASGI handler starts a thread for every
  request (a thread-sensitive context of its own) and adapts each synchronous middleware to async:
  one hop to that thread for each `process_request` and `process_response` — fourteen for seven
  middlewares — plus one each for the view and the request signals, and the thread lives as long
  as the request. An API call pays the thread and the hops in CPU and latency (1.8 ms of a 2.4 ms
  `/healthz/` here), and an open stream keeps a thread for minutes. Here synchronous views (the
  API, the admin, the pages) run as under WSGI: the request's signals, its whole middleware chain
  and the view in one call on a fixed pool of threads (`RUNLEDGER_WEB_THREADS`), which also ends
  the request there (`request_finished` gives the thread's database connection back to the pool on
  the thread that borrowed it). Asynchronous views (the SSE stream) run on the event loop with the
  async middleware chain and no thread-sensitive context: they do their database work on small
  pools of their own (runs/streaming/hub.py), so the few synchronous middleware steps they pass
  through share one thread and an open stream holds none.
- **The body limit** (`RUNLEDGER_MAX_BODY_BYTES`) applied before Django spools a body (`BodyLimit`).
- **A stream's slot given back the moment its request ends** (runs.http.request_end), not when
  the stock handler's fallback notices.
- **The edge's publisher started and stopped with the process** (the ASGI lifespan).
- **Requests counted by status** for /metrics/, the body limit's 413s and static files included.
- **The start-up checks** `runworker` also makes: the settings (runs.conf), the agents, the edge.

Other scopes (websockets, say) go to the application it wraps.
"""

import gc
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core import signals
from django.core.exceptions import RequestAborted, SuspiciousFileOperation
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.http import FileResponse, Http404, HttpRequest, HttpResponseBase
from django.urls import Resolver404, resolve, set_script_prefix

from runs.conf import conf
from runs.http.errors import error_body
from runs.http.request_end import request_ended

Scope = dict[str, Any]

log = logging.getLogger(__name__)


def wrap(inner: Any, *, serve_static: bool = False) -> Any:
    """`inner` (the project's `get_asgi_application()`, which set Django up) with what this module
    adds; `serve_static`: also serve STATIC_URL (django.contrib.staticfiles), for a deployment with
    no web server in front."""
    # Imported once Django is set up: they reach the models.
    from runs.agents.loading import require_agents
    from runs.metrics.http import CountResponses
    from runs.streaming.edge import publisher

    # A web process without the agents it is configured for would refuse their runs, and one with
    # settings that cannot work would apply them wrongly: refuse to start (uvicorn runs no system checks).
    conf.require()
    require_agents()
    publisher.require_edge()
    application: Any = BodyLimit(Application(inner), conf.MAX_BODY_BYTES)
    if serve_static:
        application = StaticFiles(application)
    # Counted outermost: the guard's 413s and the static files too (runs/metrics/http.py).
    return CountResponses(application)


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


class SyncViews(ASGIHandler):
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


class AsyncViews(ASGIHandler):
    """Async views on the event loop, without a thread-sensitive context (and so no thread) each.

    What a view holds for its request (a stream's slot of its user's cap) is given back here, once
    the request has surely ended: a client that leaves before a stream's first byte cancels the
    request anywhere between the view and its body, and a body never started runs no `finally`."""

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        from runs.streaming.responses import Unanswered

        try:
            await self.handle(scope, receive, send)
        except Unanswered as exc:
            # Its body is left unfinished on purpose: the client asks again (runs/streaming/responses.py).
            log.info("%s: %s", scope["path"], exc)
        finally:
            request_ended(scope)


class Application:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
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
        """What lives as long as the process: the edge's publisher, when there is an edge
        (runs/streaming/edge/publisher.py), which must publish whether or not this process serves
        streams."""
        from runs.streaming.edge import publisher

        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                _fewer_collector_pauses()
                publisher.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await publisher.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return


def _fewer_collector_pauses() -> None:
    """Keep the garbage collector's pauses out of the streams' delivery (docs/design/streaming.md#hub).

    A web process holding a thousand streams allocates a little per event per stream, so the
    collector's default young-generation threshold (700) ran collections every few events, and the
    full ones walked every object Django and the app made at startup besides: each a pause that every
    watcher of the event being sent shared (1,000 watchers: p99 186 to 216 ms against p95 under 45).
    What exists once the process has started is moved out of the collector's sight for good
    (gc.freeze) and the young generation collected every 50,000 allocations: p99 45 to 71 ms."""
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


def _is_async_view(scope: Scope) -> bool:
    path = scope["path"].removeprefix(scope.get("root_path", "")) or "/"
    try:
        return iscoroutinefunction(resolve(path).func)
    except Resolver404:
        return False


class BodyLimit:
    """Refuses a body over `limit` bytes before Django reads it (Django's ASGI handler spools the
    whole body to a temporary file before any middleware, and checks its size only when a view
    reads it): a declared Content-Length over the limit at once, a chunked body as soon as it
    passes the limit. For deployments without the proxy, which refuses them first (deploy/).
    The connection is closed with the answer: the rest of the body is never read."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope["headers"]:
            if name == b"content-length" and (not value.isdigit() or int(value) > self.limit):
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

    async def refuse(self, send: Any) -> None:
        message = "the request body is larger than the server accepts"
        body = json.dumps(error_body("payload_too_large", message, {"limit_bytes": self.limit})).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),  # the body is left unread: this connection cannot carry another request
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})
