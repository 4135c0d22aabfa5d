"""The middleware of the app's async views in two hops to a thread, not one per middleware method
(docs/design/streaming.md#opening)."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import MiddlewareNotUsed
from django.core.handlers.base import BaseHandler
from django.core.handlers.exception import response_for_exception
from django.http import HttpRequest, HttpResponseBase
from django.utils.deprecation import MiddlewareMixin
from django.utils.module_loading import import_string

View = Callable[..., Any]


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


class Phased:
    """`settings.MIDDLEWARE` around `handler`'s async views, when every middleware is a plain
    `MiddlewareMixin` (Django's own are). Django runs each `process_*` method around an async view in
    a hop of its own to its one thread-sensitive thread; this runs the same methods, in Django's
    order, on that thread in two hops: every `process_request` then the URL's `process_view` in one,
    the view on the loop, every `process_response` in the other. An exception is answered where
    Django's chain answers it (`convert_exception_to_response` around each middleware and the view)."""

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
        """What Django's middleware chain answers for `request`."""
        step = await sync_to_async(self._request_phase, thread_sensitive=True)(request)
        response = step.response
        if step.view is not None:
            response = await self._view(request, step.view)
        assert response is not None
        return await sync_to_async(self._response_phase, thread_sensitive=True)(request, response, step)

    def _request_phase(self, request: HttpRequest) -> "_Step":
        """Every `process_request` in order, then the URL's view and every `process_view`."""
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
