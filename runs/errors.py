"""The one error shape of DESIGN §6: {"error": {"code", "message", "detail"}} (+ "run" on 409s).

`runs.api` maps DRF's and the project's exceptions through here; plain Django views (SSE, health)
answer with `error_response` so every endpoint speaks the same shape.
"""

from typing import Any

from django.http import JsonResponse

from runs.exceptions import RunledgerError


def error_body(code: str, message: str, detail: Any = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "detail": detail}}


def error_response(status: int, code: str, message: str, detail: Any = None) -> JsonResponse:
    return JsonResponse(error_body(code, message, detail), status=status)


def error_response_for(exc: RunledgerError) -> JsonResponse:
    return error_response(exc.status_code, exc.code, exc.message, exc.detail)
