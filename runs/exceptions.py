"""One error hierarchy for the whole project (docs/design/api.md#errors), mapped to the error shape in
one place (`runs.http.errors`; for the API's DRF views, `runs.api.errors`). The bottom of the house:
it imports nothing of the project, so a conflict carries its run as a plain object."""

from typing import Any

# What the public API (docs/reference/python.md) raises, for host code to catch; the rest may change.
__all__ = [
    "BudgetExhausted",
    "InvalidTransition",
    "NotFound",
    "RunConflict",
    "RunledgerError",
    "ScheduleOverlap",
    "StaleTicket",
    "TooManyRequests",
    "ValidationFailed",
]


class RunledgerError(Exception):
    """Every refusal: `message` says what is wrong, `detail` (if any) which fields and why; `code` and
    `status_code` are the API's `error.code` and HTTP status for it (docs/reference/errors.md).
    Nothing was written."""

    status_code = 400
    code = "validation_error"

    def __init__(self, message: str, *, detail: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


class ValidationFailed(RunledgerError):
    """Bad input (a 400): `detail` maps each field at fault to its problems."""

    status_code = 400
    code = "validation_error"


class NotFound(RunledgerError):
    """No such run, or one the caller may not see (the two are never told apart)."""

    status_code = 404
    code = "not_found"


class PermissionDenied(RunledgerError):
    status_code = 403
    code = "permission_denied"


class RunConflict(RunledgerError):
    """The committed state of a run does not allow the command; `run` is that run (a
    `runs.models.Run`), for the caller to report."""

    status_code = 409
    code = "invalid_transition"

    def __init__(self, message: str, *, run: object = None, detail: Any = None) -> None:
        super().__init__(message, detail=detail)
        self.run = run


class InvalidTransition(RunConflict):
    """The run's state does not allow it: a `current` run cannot become `target` (an ended run
    cancelled, a run not ended rerun)."""

    def __init__(self, current: str, target: str, *, run: object = None) -> None:
        super().__init__(f"a {current} run cannot become {target}", run=run)
        self.current = current
        self.target = target


class StaleTicket(RunConflict):
    """A resume's ticket is not the waiting run's current one (used, or invalidated since)."""

    code = "stale_ticket"


class BudgetExhausted(RunConflict):
    """A pause or resume whose events would pass the run's `max_events`: refused, nothing written.
    (A cancel or stop is never refused for it; a worker's write past a budget stops the run.)"""

    code = "budget_exhausted"


class ScheduleOverlap(RunConflict):
    """A schedule fired by hand (`trigger`) that its overlap policy skipped: no run was created.
    `run` is the live run it waits for, when there is one."""

    code = "schedule_overlap"

    def __init__(self, *, run: object = None) -> None:
        super().__init__("the schedule's overlap policy skipped this fire: its last run is still live", run=run)


class StaleAttempt(RunConflict):
    """An attempt that is no longer the run's current one tried to write; its writes are dropped."""


class IdempotencyMismatch(RunledgerError):
    status_code = 422
    code = "idempotency_mismatch"


class TooManyRequests(RunledgerError):
    """A limit (docs/design/fair-use.md#refusals) refuses the request for now, for `retry_after`
    seconds (whole, and at least 1: the header's unit, and 0 would say "at once")."""

    code = "too_many_requests"
    status_code = 429

    def __init__(self, message: str, *, retry_after: float, detail: Any = None) -> None:
        self.retry_after = max(1, int(retry_after))
        super().__init__(message, detail=detail)


class TooManyMatches(RunledgerError):
    """More runs match a bulk command's filter than its `max`: nothing is done. Not a
    `RunConflict`: no one run is the cause, so the answer carries no `run`."""

    status_code = 409
    code = "too_many_matches"
