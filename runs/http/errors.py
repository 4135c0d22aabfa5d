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


# Every `error.code` a response can carry, its HTTP status and what it means: the reference
# (docs/reference/errors.md) is rendered from this, and tests/docs/test_docs_reference.py checks that
# every code the project's code spells is here.
ERROR_CODES: dict[str, tuple[int, str]] = {
    "validation_error": (400, "a malformed body, query, header or cursor; `detail` says which field"),
    "not_authenticated": (401, "no credentials, or bad ones"),
    "permission_denied": (403, "the run is visible to the caller but the action is not allowed"),
    "not_found": (404, "no such run, or one the caller may not see (never a 403 for those)"),
    "method_not_allowed": (405, "the URL does not take that method"),
    "not_acceptable": (406, "the `Accept` header asks for a format the URL cannot give"),
    "invalid_transition": (409, "the run's committed state does not allow the command; `run` is that state"),
    "stale_ticket": (409, "the resume ticket is not the run's current one; `run` is the run"),
    "budget_exhausted": (409, "the run has no budget left for what was asked; `run` is the run"),
    "schedule_overlap": (
        409,
        "a schedule's trigger that its overlap policy took (skipped, or left for when its live run ends): no run was "
        "created; `run` is the live run",
    ),
    "too_many_matches": (
        409,
        "more runs match a bulk command's filter than its `max`; nothing was done; `detail.count` says how many",
    ),
    "payload_too_large": (413, "the body is over the size limit (`detail.limit_bytes`)"),
    "unsupported_media_type": (415, "the body is not `application/json`"),
    "idempotency_mismatch": (422, "the `Idempotency-Key` was used with another body"),
    "too_many_requests": (429, "a limit refuses it for now; `Retry-After` says when to retry, `detail` which limit"),
    "database_unavailable": (503, "the database cannot be reached; retry later"),
    "wait_unanswered": (
        503,
        "under a WSGI server (runserver), a server-side wait that could not answer after all (its run deleted, the "
        "caller's sight of it or the database lost); ask again",
    ),
}
