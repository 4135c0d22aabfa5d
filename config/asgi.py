"""The ASGI application: `uvicorn config.asgi:application`.

Django's own ASGI handler runs every request in a thread-sensitive context of its own and adapts
each synchronous middleware to async: one hop to a thread for each `process_request` and
`process_response` — fourteen for seven middlewares — plus one for the view, and a thread kept per
request for as long as the request lasts. Both cost what Runledger's hot paths can least afford:
an API call pays the hops in CPU and latency, and an open stream keeps a thread (and its stack)
for minutes. So requests are dispatched by the kind of view their path resolves to:

- synchronous views (the API, the admin, the pages) run their whole middleware chain and the view
  in one call on the request's thread, as Django's WSGI handler would;
- asynchronous views (the SSE stream) run on the event loop with the async middleware chain and no
  thread-sensitive context: they do their database work on small pools of their own
  (runs/streams.py), so the few synchronous middleware steps they pass through share one thread
  and an open stream holds none.
"""

import os
from typing import Any

import django
from asgiref.sync import iscoroutinefunction, sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler
from django.http import HttpRequest, HttpResponseBase
from django.urls import Resolver404, resolve

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup(set_prefix=False)

# A web process without the agents it is configured for would refuse their runs: refuse to start.
from runs.agents.loading import require_agents  # noqa: E402  (needs the configured Django above)

require_agents()

Scope = dict[str, Any]


class SyncViews(ASGIHandler):
    """Middleware and view in one thread hop per request (Django's sync chain, as under WSGI)."""

    def __init__(self) -> None:
        BaseHandler.__init__(self)
        self.load_middleware(is_async=False)

    async def run_get_response(self, request: HttpRequest) -> HttpResponseBase:
        response = await sync_to_async(self.get_response, thread_sensitive=True)(request)
        response._handler_class = self.__class__  # type: ignore[attr-defined]
        return response


class AsyncViews(ASGIHandler):
    """Async views on the event loop, without a thread-sensitive context (and so no thread) each."""

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        await self.handle(scope, receive, send)


class Application:
    def __init__(self) -> None:
        self.sync_views = SyncViews()
        self.async_views = AsyncViews()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and _is_async_view(scope):
            await self.async_views(scope, receive, send)
        else:
            await self.sync_views(scope, receive, send)


def _is_async_view(scope: Scope) -> bool:
    path = scope["path"].removeprefix(scope.get("root_path", "")) or "/"
    try:
        return iscoroutinefunction(resolve(path).func)
    except Resolver404:
        return False


django_application = Application()

# The embedded deployment has no web server in front to serve the admin's static files.
application: Any
if os.environ.get("RUNLEDGER_SERVE_STATIC", "1") == "1":
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    application = ASGIStaticFilesHandler(django_application)  # type: ignore[arg-type]
else:
    application = django_application
