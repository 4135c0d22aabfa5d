"""One error hierarchy for the whole project, mapped to HTTP in one place (`runs.api.errors`)."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runs.models import Run


class RunledgerError(Exception):
    status_code = 400
    code = "validation_error"

    def __init__(self, message: str, *, detail: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


class ValidationFailed(RunledgerError):
    status_code = 400
    code = "validation_error"


class NotFound(RunledgerError):
    status_code = 404
    code = "not_found"


class PermissionDenied(RunledgerError):
    status_code = 403
    code = "permission_denied"


class RunConflict(RunledgerError):
    """The committed state of a run does not allow the command; carries that state."""

    status_code = 409
    code = "invalid_transition"

    def __init__(self, message: str, *, run: "Run | None" = None, detail: Any = None) -> None:
        super().__init__(message, detail=detail)
        self.run = run


class InvalidTransition(RunConflict):
    def __init__(self, current: str, target: str, *, run: "Run | None" = None) -> None:
        super().__init__(f"a {current} run cannot become {target}", run=run)
        self.current = current
        self.target = target


class StaleTicket(RunConflict):
    code = "stale_ticket"


class StaleAttempt(RunConflict):
    """An attempt that is no longer the run's current one tried to write; its writes are dropped."""


class IdempotencyMismatch(RunledgerError):
    status_code = 422
    code = "idempotency_mismatch"
