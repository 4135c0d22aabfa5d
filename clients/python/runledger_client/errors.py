"""One exception class per error code of the API (docs/design/api.md#errors), and the one function
that turns an error answer into its exception.

Every error the server sends has the shape `{"error": {"code", "message", "detail"}}`, plus
`"run"` (the committed state) on a 409. The class is chosen by `code`; an answer without one (a
proxy's HTML 502, say) falls back to its HTTP status.
"""

from __future__ import annotations

import email.utils
import time
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


# Each class below by the code it stands for, and by the status whose answers without a code it
# stands for: filled as each class is defined (`APIError.__init_subclass__`), so none is left out.
_BY_CODE: dict[str, type[APIError]] = {}
_BY_STATUS: dict[int, type[APIError]] = {}


class APIError(RunledgerError):
    """The server answered with an error. `code` is the API's error code
    (docs/design/api.md#errors)."""

    code: str = ""

    def __init_subclass__(cls, *, code: str = "", status: int | None = None, **kwargs: Any) -> None:
        # `class NotFound(APIError, code="not_found", status=404)`: the class of that code and of a
        # 404 that names none (a proxy's page).
        super().__init_subclass__(**kwargs)
        if code:
            cls.code = code
            _BY_CODE[code] = cls
        if status is not None:
            _BY_STATUS[status] = cls

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


class ValidationError(APIError, code="validation_error", status=400):
    """400: a malformed body, filter or cursor, an unknown agent, an invisible parent."""


class NotAuthenticated(APIError, code="not_authenticated", status=401):
    """401: no token, or a wrong one."""


class PermissionDenied(APIError, code="permission_denied", status=403):
    """403: a visible run, an action the caller may not take on it."""


class NotFound(APIError, code="not_found", status=404):
    """404: no such run, or one the caller cannot see."""


class MethodNotAllowed(APIError, code="method_not_allowed", status=405):
    """405: the URL does not take that method."""


class Conflict(APIError, status=409):
    """409: the run's committed state refused the command. `run` is that committed run, so the
    caller converges to the truth (e.g. a cancel that lost the race to `completed`)."""

    run: Run | None


class InvalidTransition(Conflict, code="invalid_transition"):
    """409: the run's committed state does not allow the command (`run` is that state)."""


class StaleTicket(Conflict, code="stale_ticket"):
    """409: a resume with a ticket that is not (or no longer) the run's."""


class BudgetExhausted(Conflict, code="budget_exhausted"):
    """409: a pause or resume whose events would pass the run's `max_events`; nothing was written
    (`.run` shows `events_used` and `max_events`). A cancel or stop is never refused for it."""


class ScheduleOverlap(Conflict, code="schedule_overlap"):
    """409 from a schedule's `trigger`: its overlap policy skipped the fire (the last run is still
    live, under `skip` or `buffer_one` with one already waiting); no run was created. `run` is that
    live run, when there is one."""


class TooManyMatches(APIError, code="too_many_matches"):
    """409 from `cancel_where`/`stop_where`: more runs match than `max`; nothing was done. `count`
    is how many match (no `run`: no one run refused)."""

    @property
    def count(self) -> int:
        return int(self.detail["count"]) if isinstance(self.detail, dict) else 0


class PayloadTooLarge(APIError, code="payload_too_large", status=413):
    """413: the body is over the size limit (`detail["limit_bytes"]`)."""


class UnsupportedMediaType(APIError, code="unsupported_media_type", status=415):
    """415: the body is not `application/json`."""


class IdempotencyMismatch(APIError, code="idempotency_mismatch", status=422):
    """422: the Idempotency-Key was used before with another body."""


class TooManyRequests(APIError, code="too_many_requests", status=429):
    """429: a limit of the caller's (active runs, open streams); `retry_after` in seconds, if said."""


# No status: a 503 without the error shape comes from before the server (a proxy, a balancer), not from
# it about its database; it stays an APIError (`http_503`).
class DatabaseUnavailable(APIError, code="database_unavailable"):
    """503: the server cannot reach its database; retried by the client before it is raised."""


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
