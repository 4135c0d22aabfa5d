"""Hot GETs answered without DRF's request cycle (docs/design/api.md#hot-reads): a common request is
authenticated, checked and answered as the operation's DRF view answers it; any other goes to that
view, which keeps the operation's schema."""

import functools
from collections.abc import Callable
from typing import Any, cast

from django.http import HttpRequest, HttpResponseBase
from rest_framework import exceptions
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.settings import api_settings

from runs.access import User
from runs.api.errors import exception_handler
from runs.http.authentication import token_credentials

# What DRF's negotiation would answer with JSON, compact: no header, or one that asks for JSON or
# anything. Others (an `indent` parameter, a list, a format DRF refuses with a 406) go to DRF.
_ACCEPTED = (None, "*/*", "application/json")
_RENDERER = JSONRenderer()

# The run's JSON (or a plain response) for an authenticated user and the URL's arguments.
Answer = Callable[..., Any]


def plain_get(
    drf_view: Callable[..., HttpResponseBase], answer: Answer, headers: dict[str, str], *, query: bool = False
) -> Any:
    """`drf_view` (an `ApiView` subclass's `as_view()`), with its common GETs answered by
    `answer(user, **url_kwargs)` — `answer(user, query_dict, **url_kwargs)` with `query`, for an
    operation that takes parameters (DRF's format parameter left to DRF); `headers`: what its
    `finalize_response` adds to every answer (Allow, and the class's own). The result keeps
    `drf_view`'s attributes, so that the schema finds the view class."""

    @functools.wraps(drf_view)
    def view(request: HttpRequest, **kwargs: Any) -> HttpResponseBase:
        if not _plain(request, query=query):
            return drf_view(request, **kwargs)
        try:
            user = _authenticated(request)
            result = answer(user, request.GET, **kwargs) if query else answer(user, **kwargs)
            response = result if isinstance(result, HttpResponseBase) else _rendered(Response(result))
        except Exception as exc:
            handled = exception_handler(exc, {"request": None})
            if handled is None:
                raise  # a bug: Django logs it and answers 500, as under DRF
            response = _rendered(handled)
        for name, value in headers.items():
            response[name] = value
        return response

    return view


def _plain(request: HttpRequest, *, query: bool) -> bool:
    return (
        request.method == "GET"
        and (api_settings.URL_FORMAT_OVERRIDE not in request.GET if query else not request.META.get("QUERY_STRING"))
        and request.META.get("HTTP_ACCEPT") in _ACCEPTED
        # DRF's test client forces its requests' authentication by attributes only DRF's request reads.
        and getattr(request, "_force_auth_user", None) is None
        and getattr(request, "_force_auth_token", None) is None
    )


def _authenticated(request: HttpRequest) -> User:
    """The caller as `ApiView`'s authentication finds it: the token header (a bad one refused, an
    address with too many failures a 429), else the session's active user, else a 401."""
    try:
        found = token_credentials(request)
    except (exceptions.AuthenticationFailed, exceptions.NotAuthenticated) as exc:
        raise _challenging(exc) from None
    user = found[0] if found is not None else getattr(request, "user", None)
    if user is None or not user.is_active:
        raise _challenging(exceptions.NotAuthenticated())
    request.user = user  # as DRF's request sets it on the request it wraps
    return cast(User, user)


def _challenging(exc: exceptions.APIException) -> exceptions.APIException:
    # DRF's view names its first authentication's scheme on a 401 so (the API's is the token).
    setattr(exc, "auth_header", "Token")  # noqa: B010
    return exc


def _rendered(response: Response) -> Response:
    response.accepted_renderer = _RENDERER
    response.accepted_media_type = _RENDERER.media_type
    response.renderer_context = {}  # type: ignore[attr-defined]  # DRF's view sets it so
    return response
