"""Every error code of docs/design/api.md#errors has its exception; a 409 carries the committed
run."""

import httpx
import pytest

import runledger_client as rl
from runledger_client.errors import error_from

CODES = [
    (400, "validation_error", rl.ValidationError),
    (401, "not_authenticated", rl.NotAuthenticated),
    (403, "permission_denied", rl.PermissionDenied),
    (404, "not_found", rl.NotFound),
    (405, "method_not_allowed", rl.MethodNotAllowed),
    (409, "invalid_transition", rl.InvalidTransition),
    (409, "stale_ticket", rl.StaleTicket),
    (409, "budget_exhausted", rl.BudgetExhausted),
    (409, "schedule_overlap", rl.ScheduleOverlap),
    (413, "payload_too_large", rl.PayloadTooLarge),
    (415, "unsupported_media_type", rl.UnsupportedMediaType),
    (422, "idempotency_mismatch", rl.IdempotencyMismatch),
    (429, "too_many_requests", rl.TooManyRequests),
    (503, "database_unavailable", rl.DatabaseUnavailable),
]


@pytest.mark.parametrize(("status", "code", "exception"), CODES)
def test_each_code_is_its_exception(status: int, code: str, exception: type[rl.APIError]) -> None:
    body = {"error": {"code": code, "message": "no", "detail": {"f": ["bad"]}}}
    error = error_from(httpx.Response(status, json=body))
    assert type(error) is exception
    assert (error.status, error.code, error.message, error.detail) == (status, code, "no", {"f": ["bad"]})


def test_a_conflict_carries_the_committed_run() -> None:
    body = {
        "error": {"code": "invalid_transition", "message": "m", "detail": None},
        "run": {"id": "r1", "status": "completed"},
    }
    error = error_from(httpx.Response(409, json=body))
    assert isinstance(error, rl.Conflict)
    assert error.run is not None and error.run.status == "completed"


def test_a_runs_budgets_read_beside_what_is_used_of_them() -> None:
    run = rl.Run.from_body(
        {"id": "r1", "status": "waiting", "max_steps": None, "steps_used": 2, "max_events": 5, "events_used": 5}
    )
    assert (run.max_steps, run.steps_used, run.max_events, run.events_used) == (None, 2, 5, 5)
    error = error_from(
        httpx.Response(409, json={"error": {"code": "budget_exhausted", "message": "m"}, "run": run.data})
    )
    assert isinstance(error, rl.Conflict) and error.run is not None and error.run.events_used == 5


def test_retry_after_is_read_in_seconds() -> None:
    body = {"error": {"code": "too_many_requests", "message": "slow down", "detail": None}}
    error = error_from(httpx.Response(429, json=body, headers={"Retry-After": "7"}))
    assert isinstance(error, rl.TooManyRequests) and error.retry_after == 7


def test_an_answer_without_the_error_shape_falls_back_to_its_status() -> None:
    error = error_from(httpx.Response(404, text="<html>not here</html>"))
    assert type(error) is rl.NotFound
    error = error_from(httpx.Response(502, text="bad gateway"))
    assert type(error) is rl.APIError and error.code == "http_502"
