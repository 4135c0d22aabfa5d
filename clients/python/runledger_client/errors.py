"""One exception class per error code of the API (docs/design/api.md#errors), and the one function
that turns an error answer into its exception.

Every error the server sends has the shape `{"error": {"code", "message", "detail"}}`, plus
`"run"` (the committed state) on a 409. The class is chosen by `code`; an answer without one (a
proxy's HTML 502, say) falls back to its HTTP status.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Iterator
from typing import Any

import httpx

from runledger_client.models import Run


class RunledgerError(Exception):
    """Anything this client raises about the server or the way to it."""


class ConfigError(RunledgerError):
    """No server or token could be found (arguments, environment, config file), or the config
    file, a named profile or a token file could not be read."""


class TransportError(RunledgerError):
    """The server could not be reached, or the connection failed, after the retries allowed."""


class APIError(RunledgerError):
    """The server answered with an error. `code` is the API's error code
    (docs/design/api.md#errors)."""

    code: str = ""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        code: str | None = None,
        detail: Any = None,
        run: Run | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code or type(self).code or f"http_{status}"
        self.detail = detail
        self.run = run
        self.retry_after = retry_after

    def __str__(self) -> str:
        return f"{self.code} ({self.status}): {self.message}"


class ValidationError(APIError):
    """400: a malformed body, filter or cursor, an unknown agent, an invisible parent."""

    code = "validation_error"


class NotAuthenticated(APIError):
    """401: no token, or a wrong one."""

    code = "not_authenticated"


class PermissionDenied(APIError):
    """403: a visible run, an action the caller may not take on it."""

    code = "permission_denied"


class NotFound(APIError):
    """404: no such run, or one the caller cannot see."""

    code = "not_found"


class MethodNotAllowed(APIError):
    code = "method_not_allowed"


class Conflict(APIError):
    """409: the run's committed state refused the command. `run` is that committed run, so the
    caller converges to the truth (e.g. a cancel that lost the race to `completed`)."""

    run: Run | None


class InvalidTransition(Conflict):
    code = "invalid_transition"


class StaleTicket(Conflict):
    """409: a resume with a ticket that is not (or no longer) the run's."""

    code = "stale_ticket"


class BudgetExhausted(Conflict):
    """409: a pause or resume whose events would pass the run's `max_events`; nothing was written
    (`.run` shows `events_used` and `max_events`). A cancel or stop is never refused for it."""

    code = "budget_exhausted"


class ScheduleOverlap(Conflict):
    """409 from a schedule's `trigger`: its overlap policy skipped the fire (the last run is still
    live, under `skip` or `buffer_one` with one already waiting); no run was created. `run` is that
    live run, when there is one."""

    code = "schedule_overlap"


class TooManyMatches(APIError):
    """409 from `cancel_where`/`stop_where`: more runs match than `max`; nothing was done. `count`
    is how many match (no `run`: no one run refused)."""

    code = "too_many_matches"

    @property
    def count(self) -> int:
        return int(self.detail["count"]) if isinstance(self.detail, dict) else 0


class PayloadTooLarge(APIError):
    code = "payload_too_large"


class UnsupportedMediaType(APIError):
    code = "unsupported_media_type"


class IdempotencyMismatch(APIError):
    """422: the Idempotency-Key was used before with another body."""

    code = "idempotency_mismatch"


class TooManyRequests(APIError):
    """429: a limit of the caller's (active runs, open streams); `retry_after` in seconds, if said."""

    code = "too_many_requests"


class DatabaseUnavailable(APIError):
    """503: the server cannot reach its database; retried by the client before it is raised."""

    code = "database_unavailable"


def _below(base: type[APIError]) -> Iterator[type[APIError]]:
    for cls in base.__subclasses__():
        yield cls
        yield from _below(cls)


# Each class above by its code, read from the classes (all defined by now), so none is left out.
_BY_CODE: dict[str, type[APIError]] = {cls.code: cls for cls in _below(APIError) if cls.code}
_BY_STATUS: dict[int, type[APIError]] = {
    400: ValidationError,
    401: NotAuthenticated,
    403: PermissionDenied,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    422: IdempotencyMismatch,
    429: TooManyRequests,
}


def retry_after(response: httpx.Response) -> float | None:
    """The `Retry-After` header in seconds (a number or an HTTP date), if any."""
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def error_from(response: httpx.Response) -> APIError:
    """The exception for an error answer (its body must have been read)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        text = response.text.strip()[:200] or response.reason_phrase
        cls = _BY_STATUS.get(response.status_code, APIError)
        return cls(text, status=response.status_code, retry_after=retry_after(response))
    code = str(error.get("code") or "")
    cls = _BY_CODE.get(code) or _BY_STATUS.get(response.status_code, APIError)
    run = body.get("run") if isinstance(body, dict) else None
    return cls(
        str(error.get("message") or code),
        status=response.status_code,
        code=code or None,
        detail=error.get("detail"),
        run=Run.from_body(run) if isinstance(run, dict) else None,
        retry_after=retry_after(response),
    )
