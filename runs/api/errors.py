"""The API's errors in the one error shape (docs/design/api.md#errors, runs.http.errors), + "run" on
409s: the one mapping of every error a DRF view raises to it.

The API's views reach it through `exception_handler` (set on each by runs.api.base); the plain
views (the stream, the probes, /metrics/) answer with runs.http.errors' `error_response`, so every
endpoint speaks the same shape. The hierarchy itself is `runs.exceptions`.
"""

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions as drf
from rest_framework.response import Response
from rest_framework.views import set_rollback

from runs.api.serializers import RunOutputSerializer
from runs.exceptions import RunConflict, RunledgerError, TooManyRequests
from runs.http.errors import error_body, error_response
from runs.models import Run

# DRF's exceptions that have a code of docs/design/api.md#errors; the others keep DRF's code
# (method_not_allowed, not_acceptable, unsupported_media_type).
_DRF_CODES: list[tuple[type[drf.APIException], str]] = [
    (drf.ValidationError, "validation_error"),
    (drf.ParseError, "validation_error"),
    (drf.NotAuthenticated, "not_authenticated"),
    (drf.AuthenticationFailed, "not_authenticated"),
    (drf.PermissionDenied, "permission_denied"),
    (drf.NotFound, "not_found"),
    (drf.Throttled, "too_many_requests"),
]


def _validation_message(detail: Any) -> str:
    if isinstance(detail, dict):
        parts = []
        for field, messages in detail.items():
            first = messages[0] if isinstance(messages, list) and messages else messages
            parts.append(f"{field}: {first}")
        return "invalid input: " + "; ".join(parts)
    if isinstance(detail, list) and detail:
        return f"invalid input: {detail[0]}"
    return f"invalid input: {detail}"


def _error(status: int, code: str, message: str, detail: Any = None, headers: dict[str, str] | None = None) -> Response:
    set_rollback()
    return Response(error_body(code, message, detail), status=status, headers=headers)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, RunledgerError):
        body = error_body(exc.code, exc.message, exc.detail)
        if isinstance(exc, RunConflict) and isinstance(exc.run, Run):
            # The committed state, so the client converges to the truth
            # (docs/design/commands.md#idempotency).
            body["run"] = RunOutputSerializer(exc.run, context={"request": context.get("request")}).data
        set_rollback()
        retry = {"Retry-After": str(exc.retry_after)} if isinstance(exc, TooManyRequests) else None
        return Response(body, status=exc.status_code, headers=retry)
    if isinstance(exc, RequestDataTooBig):
        return _error(413, "payload_too_large", "the request body is larger than the server accepts")
    if isinstance(exc, OperationalError | InterfaceError):
        return _error(503, "database_unavailable", "the database is unavailable; retry later")
    if isinstance(exc, Http404):
        exc = drf.NotFound(*exc.args)
    elif isinstance(exc, DjangoPermissionDenied):
        exc = drf.PermissionDenied(*exc.args)
    if not isinstance(exc, drf.APIException):
        return None  # a bug: let Django log it and answer 500
    headers = {}
    if auth_header := getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = auth_header
    if wait := getattr(exc, "wait", None):
        headers["Retry-After"] = str(int(wait))
    code = next((code for cls, code in _DRF_CODES if isinstance(exc, cls)), exc.default_code)
    if isinstance(exc, drf.ValidationError):
        detail = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        return _error(exc.status_code, code, _validation_message(detail), detail, headers)
    return _error(exc.status_code, str(code), str(exc.detail), None, headers)


@csrf_exempt
def api_not_found(request: HttpRequest, path: str = "") -> JsonResponse:
    """Unknown URLs under /api/ answer in the API's error shape, whatever the method."""
    return error_response(404, "not_found", f"no API endpoint at {request.path}")
