"""Hot requests answered without DRF's request cycle (docs/design/api.md#hot-reads): a common GET,
or a common command or create (a token's JSON body its serializer accepts), is authenticated, checked and
answered as the operation's DRF view answers it; any other goes to that view, which keeps the
operation's schema."""

import functools
import io
import threading
from collections.abc import Callable
from typing import Any, cast

from django.conf import settings
from django.http import HttpRequest, HttpResponseBase
from rest_framework import exceptions, serializers
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.settings import api_settings

from runs.access import User
from runs.api.base import ApiView
from runs.api.errors import exception_handler
from runs.api.parsers import JSONParser
from runs.http.authentication import token_credentials

# What DRF's negotiation would answer with JSON, compact: no header, or one that asks for JSON or
# anything. Others (an `indent` parameter, a list, a format DRF refuses with a 406) go to DRF.
_ACCEPTED = (None, "*/*", "application/json")
_RENDERER = JSONRenderer()
_PARSER = JSONParser()
# Each thread's bound instance of each body serializer: made (its fields deep-copied and bound) once,
# then validating one body after another, as DRF's ListSerializer validates each item by one child.
_BOUND = threading.local()

# The run's JSON (or a plain response) for an authenticated user and the URL's arguments.
Answer = Callable[..., Any]
Body = type[serializers.Serializer[Any]]


def plain(
    drf_view: Callable[..., HttpResponseBase],
    answer: Answer,
    headers: dict[str, str],
    *,
    query: bool = False,
    body: Body | None = None,
    whole: bool = False,
) -> Any:
    """`drf_view` (an `ApiView` subclass's `as_view()`), with its common requests answered by
    `answer(user, **url_kwargs)`: GETs, or with `body` POSTs whose body that serializer accepts,
    `answer(user, validated_data, **url_kwargs)`; with `query`, `answer(user, query_dict,
    **url_kwargs)`, for a GET that takes parameters (DRF's format parameter left to DRF); with `whole`
    too, `answer(user, validated_data, parsed_body, request_headers, **url_kwargs)`, for a command that
    keeps its body as sent or reads a header. `answer` returns the JSON, or a DRF `Response` (its
    status and headers its own), or any response. `headers`:
    what its `finalize_response` adds to every answer (Allow, and the class's own). The result keeps
    `drf_view`'s attributes, so that the schema finds the view class."""

    @functools.wraps(drf_view)
    def view(request: HttpRequest, **kwargs: Any) -> HttpResponseBase:
        if body is not None:
            found = _command_body(request, body)
            if found is None:
                return drf_view(request, **kwargs)
            given: tuple[Any, ...] = (*found, request.headers) if whole else found[:1]
        elif _plain_get(request, query=query):
            given = (request.GET,) if query else ()
        else:
            return drf_view(request, **kwargs)
        try:
            user = _authenticated(request)
            result = answer(user, *given, **kwargs)
            if not isinstance(result, HttpResponseBase):
                result = Response(result)
            response = _rendered(result) if isinstance(result, Response) else result
        except Exception as exc:
            # The run of a 409 shows its ticket as the DRF view's does: to the caller, who may see it.
            handled = exception_handler(exc, {"request": request})
            if handled is None:
                raise  # a bug: Django logs it and answers 500, as under DRF
            response = _rendered(handled)
        for name, value in headers.items():
            response[name] = value
        return response

    return view


def _common(request: HttpRequest) -> bool:
    return (
        request.META.get("HTTP_ACCEPT") in _ACCEPTED
        # DRF's test client forces its requests' authentication by attributes only DRF's request reads.
        and getattr(request, "_force_auth_user", None) is None
        and getattr(request, "_force_auth_token", None) is None
    )


def _plain_get(request: HttpRequest, *, query: bool) -> bool:
    return (
        request.method == "GET"
        and (api_settings.URL_FORMAT_OVERRIDE not in request.GET if query else not request.META.get("QUERY_STRING"))
        and _common(request)
    )


def _command_body(request: HttpRequest, body: Body) -> tuple[dict[str, Any], Any] | None:
    """The body of a common command as `body` validates it, and as parsed; None for a request DRF answers: another
    method, a query string, no token (a session's write needs DRF's CSRF check), a body that is not
    JSON or that the serializer refuses (DRF refuses it, after checking the run: api.md#check-order).
    Only the body is read here, nothing else done, so DRF starts from the request as it came."""
    meta = request.META
    if request.method != "POST" or meta.get("QUERY_STRING") or not _common(request):
        return None
    if not meta.get("HTTP_AUTHORIZATION", "").startswith("Token "):
        return None
    length = meta.get("CONTENT_LENGTH") or "0"
    content_type = meta.get("CONTENT_TYPE", "")
    if length == "0" and content_type in ("", "application/json"):
        data: Any = {}  # DRF's data for no body
    elif content_type == "application/json" and length.isdigit() and _within_limit(int(length)):
        try:
            data = _PARSER.parse(io.BytesIO(request.body))
        except exceptions.ParseError:
            return None
    else:
        return None
    kept: dict[Body, serializers.Serializer[Any]] = _BOUND.__dict__.setdefault("kept", {})
    serializer = kept.get(body) or kept.setdefault(body, body())
    try:
        return dict(serializer.run_validation(data)), data  # what `is_valid` keeps as validated_data
    except serializers.ValidationError:
        return None


def _within_limit(length: int) -> bool:
    # A longer body is DRF's to refuse (a 413), after the checks that come first.
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return limit is None or length <= limit


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


class Plain(ApiView):
    """An operation (beside its class of runs.api.apis) whose common requests `plain` answers by its
    `answer`, which its DRF method answers with too: GETs; with `body` (its input serializer), POSTs,
    and with `whole` the answer also gets the body as parsed and the request's headers. `query`: a
    GET that takes query parameters."""

    query = False
    body: Body | None = None
    whole = False
    answer: Callable[..., Any]
    answer_headers: dict[str, str]  # what the operation's DRF view adds to each answer

    @classmethod
    def as_view(cls, **initkwargs: Any) -> Any:
        view = cls(**initkwargs)
        view.setup(HttpRequest())  # as a request's view is: with `head`, which Allow names
        headers = {**view.default_response_headers, **cls.answer_headers}
        drf_view = super().as_view(**initkwargs)
        return plain(drf_view, cls.answer, headers, query=cls.query, body=cls.body, whole=cls.whole)
