"""The middleware of the app's async views in two hops to a thread, not one per middleware method, and
for a view that declares its opening one hop before its first byte (docs/design/streaming.md#opening)."""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import MiddlewareNotUsed
from django.core.handlers.base import BaseHandler
from django.core.handlers.exception import response_for_exception
from django.http import HttpRequest, HttpResponseBase
from django.utils.deprecation import MiddlewareMixin
from django.utils.module_loading import import_string

View = Callable[..., Any]

# The path's match, found once per request: by the application, to pick the view's handler, and
# taken by the handler's Django (asgi.py `ResolvedOnce`) instead of resolving the path again.
RESOLVED = "runledger.resolved"


def _never(request: HttpRequest) -> HttpResponseBase:
    raise AssertionError("a phased middleware never calls the next one itself")


def _plain(middleware: type) -> bool:
    """A middleware whose whole behaviour is its `process_*` methods (`MiddlewareMixin.__call__`)."""
    return (
        isinstance(middleware, type)
        and issubclass(middleware, MiddlewareMixin)
        and middleware.__call__ is MiddlewareMixin.__call__
        and middleware.__acall__ is MiddlewareMixin.__acall__
    )


class Opening(Protocol):
    """What an async view does on a thread before its first byte, declared as the view's `opening`
    attribute. Phased runs it in the hop of the middleware's request phase, on the view's own
    threads, and the response phase over the answer it makes in that hop too: one hop where there
    were four (Django's `request_started`, the request phase, the view's own call, the response
    phase). The view reads what it made with `opened(request)`."""

    def prepare(self, request: HttpRequest) -> Any:
        """On the loop, before the hop: what `open` needs from there; None: nothing opens in the
        hop (the view opens itself, as without Phased)."""

    def hop(self, fn: Callable[[], Any]) -> Awaitable[Any]:
        """`fn()` on the view's threads."""

    def open(self, request: HttpRequest, prepared: Any, *args: Any, **kwargs: Any) -> tuple[HttpResponseBase, Any]:
        """On the thread, after the request phase: the answer so far (a refusal, or the head of
        the answer the view goes on with) and whatever else the view needs."""

    def failed(self, exc: Exception) -> HttpResponseBase:
        """The answer when the hop failed (`exc` raised again if it has none)."""


OPENED, STARTED = "runledger_opened", "runledger_started"


def opened(request: HttpRequest) -> tuple[HttpResponseBase, Any] | None:
    """What the view's `opening` made in Phased's hop, its answer through the response phase already:
    the view returns that very answer to send it as it is. None: the view opens itself."""
    return getattr(request, OPENED, None)


class Phased:
    """`settings.MIDDLEWARE` around `handler`'s async views, when every middleware is a plain
    `MiddlewareMixin` (Django's own are). Django runs each `process_*` method around an async view in
    a hop of its own to its one thread-sensitive thread; this runs the same methods, in Django's
    order, on that thread in two hops: Django's `request_started`, every `process_request` then the
    URL's `process_view` in one, the view on the loop, every `process_response` in the other. A view
    with an `opening` has them in one hop (`Opening`). An exception is answered where Django's
    chain answers it (`convert_exception_to_response` around each middleware and the view)."""

    def __init__(self, handler: BaseHandler, middleware: list[MiddlewareMixin]) -> None:
        self.handler = handler
        self.middleware = middleware
        self.view_middleware = [m.process_view for m in middleware if hasattr(m, "process_view")]
        inner_first = middleware[::-1]
        self.template_middleware = [
            m.process_template_response for m in inner_first if hasattr(m, "process_template_response")
        ]
        self.exception_middleware = [m.process_exception for m in inner_first if hasattr(m, "process_exception")]

    @classmethod
    def load(cls, handler: BaseHandler) -> "Phased | None":
        """The site's middleware phased, or None when one is not a plain `MiddlewareMixin` (Django's
        own async chain then serves, hop by hop)."""
        loaded: list[MiddlewareMixin] = []
        # In Django's order of loading (innermost first), which its MiddlewareNotUsed follows too.
        for path in reversed(settings.MIDDLEWARE):
            middleware = import_string(path)
            if not _plain(middleware):
                return None
            try:
                loaded.insert(0, middleware(_never))
            except MiddlewareNotUsed:
                continue
        return cls(handler, loaded)

    async def __call__(self, request: HttpRequest) -> HttpResponseBase:
        """What Django's middleware chain answers for `request` (Django's `request_started` sent)."""
        match = getattr(request, "scope", {}).get(RESOLVED)
        opening: Opening | None = getattr(getattr(match, "func", None), "opening", None)
        prepared = opening.prepare(request) if opening is not None else None
        if opening is not None and prepared is not None:
            try:
                step = await opening.hop(lambda: self._opened(request, opening, prepared))
            except Exception as exc:
                # The hop failed before the view could answer: its answer through the chain.
                failed = opening.failed(exc)
                step = await sync_to_async(self._request_phase, thread_sensitive=True)(request)
                step = replace(step, response=step.response or failed, view=None)
        else:
            step = await sync_to_async(self._request_phase, thread_sensitive=True)(request)
        response = step.response
        if step.view is not None:
            response = await self._view(request, step.view)
            early = opened(request)
            if early is not None and response is early[0]:
                return response  # the opening's answer, through the response phase in its hop
        assert response is not None
        return await sync_to_async(self._response_phase, thread_sensitive=True)(request, response, step)

    def _opened(self, request: HttpRequest, opening: Opening, prepared: Any) -> "_Step":
        """The request phase, then the view's `opening` and the response phase over its answer."""
        step = self._request_phase(request)
        if step.view is not None:
            _, _, args, kwargs = step.view
            try:
                answer, made = opening.open(request, prepared, *args, **kwargs)
            except Exception as exc:
                # As the view's own exception: `process_exception`, else Django's answer to it.
                try:
                    answer = self._exception(request, exc)
                except Exception as unanswered:
                    answer = response_for_exception(request, unanswered)
                made = None
            setattr(request, OPENED, (self._response_phase(request, answer, step), made))
        return step

    def _request_phase(self, request: HttpRequest) -> "_Step":
        """Django's `request_started` (the handler leaves it to this hop), every `process_request` in
        order, then the URL's view and every `process_view`."""
        if not getattr(request, STARTED, False):  # once, should a failed opening's hop have sent it
            setattr(request, STARTED, True)
            signals.request_started.send(sender=type(self.handler), scope=getattr(request, "scope", None))
        for entered, middleware in enumerate(self.middleware):
            if not hasattr(middleware, "process_request"):
                continue
            try:
                response = middleware.process_request(request)
            except Exception as exc:
                # Its own process_response is skipped, as around a middleware that raises.
                return _Step(response_for_exception(request, exc), entered)
            if response:
                return _Step(response, entered + 1)
        # Inside Django's innermost handler from here: everything entered, a template response rendered.
        entered = len(self.middleware)
        try:
            callback, args, kwargs = self.handler.resolve_request(request)
            for process_view in self.view_middleware:
                response = process_view(request, callback, args, kwargs)
                if response:
                    return _Step(response, entered, inner=True)
            view = (callback, self.handler.make_view_atomic(callback), args, kwargs)
            return _Step(None, entered, inner=True, view=view)
        except Exception as exc:
            return _Step(response_for_exception(request, exc), entered)

    async def _view(self, request: HttpRequest, view: tuple[View, View, Any, Any]) -> HttpResponseBase:
        """The view, on the loop; an exception goes to `process_exception` and is answered there."""
        callback, wrapped, args, kwargs = view
        try:
            try:
                response = await wrapped(request, *args, **kwargs)
            except Exception as exc:
                response = await sync_to_async(self._exception, thread_sensitive=True)(request, exc)
            self.handler.check_response(response, callback)
            return response
        except Exception as exc:
            return await sync_to_async(response_for_exception, thread_sensitive=False)(request, exc)

    def _exception(self, request: HttpRequest, exc: Exception) -> HttpResponseBase:
        for process_exception in self.exception_middleware:
            response = process_exception(request, exc)
            if response:
                return response
        raise exc

    def _response_phase(self, request: HttpRequest, response: HttpResponseBase, step: "_Step") -> HttpResponseBase:
        """A template response's middleware and rendering (for the view's or a `process_view`'s
        answer), then `process_response` of every middleware entered, innermost first."""
        if step.inner and callable(getattr(response, "render", None)):
            try:
                for process_template_response in self.template_middleware:
                    response = process_template_response(request, response)
                    self.handler.check_response(response, process_template_response)
                response = response.render()  # type: ignore[attr-defined]
            except Exception as exc:
                try:
                    response = self._exception(request, exc)
                except Exception as unanswered:
                    response = response_for_exception(request, unanswered)
        for middleware in reversed(self.middleware[: step.entered]):
            if hasattr(middleware, "process_response"):
                try:
                    response = middleware.process_response(request, response)
                except Exception as exc:
                    response = response_for_exception(request, exc)
        return response


@dataclass(frozen=True)
class _Step:
    """Where the request phase left a request: an answer already, or the view to call; and how many
    middleware it entered (their `process_response` runs)."""

    response: HttpResponseBase | None
    entered: int
    # Inside the innermost handler (the URL resolved): a template response is rendered there.
    inner: bool = False
    view: tuple[View, View, Any, Any] | None = None
