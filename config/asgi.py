"""The ASGI application: `uvicorn config.asgi:application`.

Django's own ASGI handler starts a thread for every request (a thread-sensitive context of its
own) and adapts each synchronous middleware to async: one hop to that thread for each
`process_request` and `process_response` — fourteen for seven middlewares — plus one each for the
view and the request signals, and the thread lives as long as the request. Both cost what
Runledger's hot paths can least afford: an API call pays the thread and the hops in CPU and
latency (1.8 ms of a 2.4 ms `/healthz/` here), and an open stream keeps a thread for minutes. So
requests are dispatched by the kind of view their path resolves to:

- synchronous views (the API, the admin, the pages) run as under WSGI: the request's signals, its
  whole middleware chain and the view in one call on a fixed pool of threads
  (`RUNLEDGER_WEB_THREADS`), which also ends the request there (`request_finished` gives the
  thread's database connection back to the pool on the thread that borrowed it);
- asynchronous views (the SSE stream) run on the event loop with the async middleware chain and no
  thread-sensitive context: they do their database work on small pools of their own
  (runs/streams.py), so the few synchronous middleware steps they pass through share one thread
  and an open stream holds none.
"""

import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

import django
from asgiref.sync import iscoroutinefunction, sync_to_async
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.http import HttpResponseBase
from django.urls import Resolver404, resolve, set_script_prefix

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup(set_prefix=False)

# A web process without the agents it is configured for would refuse their runs, and one with
# settings that cannot work would apply them wrongly: refuse to start (uvicorn runs no system checks).
from config.environment import site  # noqa: E402
from runs.agents.loading import require_agents  # noqa: E402  (needs the configured Django above)
from runs.api.errors import error_body  # noqa: E402
from runs.conf import conf  # noqa: E402
from runs.edge import publisher  # noqa: E402
from runs.metrics.http import CountResponses  # noqa: E402
from runs.stream_guard import REQUEST_END  # noqa: E402

conf.require()
require_agents()
publisher.require_edge()

Scope = dict[str, Any]


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
        try:
            await self.handle(scope, receive, send)
        finally:
            for release in scope.get(REQUEST_END, ()):
                release()


class Application:
    def __init__(self) -> None:
        self.sync_views = SyncViews()
        self.async_views = AsyncViews()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and _is_async_view(scope):
            await self.async_views(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self.lifespan(receive, send)
        else:
            await self.sync_views(scope, receive, send)

    async def lifespan(self, receive: Any, send: Any) -> None:
        """What lives as long as the process: the edge's publisher, when there is an edge
        (runs/edge/publisher.py), which must publish whether or not this process serves streams."""
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                publisher.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await publisher.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return


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


django_application = BodyLimit(Application(), conf.MAX_BODY_BYTES)

# The embedded deployment has no web server in front to serve the admin's static files.
application: Any
if site.SERVE_STATIC:
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    application = ASGIStaticFilesHandler(django_application)  # type: ignore[arg-type]
else:
    application = django_application

# Requests by status, counted outermost: the guard's 413s and the static files too (runs/metrics/http.py).
application = CountResponses(application)
