"""The one error shape (docs/design/api.md#errors), {"error": {"code", "message", "detail"}} (+
"run" on the API's 409s), for every endpoint: the API, the stream and the edge, the probes,
/metrics/, the body limit. The hierarchy itself is `runs.exceptions`; the API's DRF views reach this
shape through `runs.api.errors.exception_handler`, plain views answer with `error_response`.
"""

from typing import Any

from django.http import JsonResponse

from runs.exceptions import RunledgerError, TooManyRequests


def error_body(code: str, message: str, detail: Any = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "detail": detail}}


def error_response(status: int, code: str, message: str, detail: Any = None) -> JsonResponse:
    return JsonResponse(error_body(code, message, detail), status=status)


def error_response_for(exc: RunledgerError) -> JsonResponse:
    response = error_response(exc.status_code, exc.code, exc.message, exc.detail)
    if isinstance(exc, TooManyRequests):
        response["Retry-After"] = str(exc.retry_after)
    return response
