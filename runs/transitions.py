"""The run state machine (docs/design/states.md): one table, pure Python, no ORM.

Every status change in the project is checked here; nothing else decides what may follow what.
"""

from enum import StrEnum

from runs.exceptions import InvalidTransition


class Status(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STOPPED = "stopped"


TERMINAL: frozenset[Status] = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED, Status.STOPPED})
# Queued, running or waiting: what the active-runs cap counts (docs/design/fair-use.md#caps).
LIVE: frozenset[Status] = frozenset(Status) - TERMINAL

ALLOWED: dict[Status, frozenset[Status]] = {
    Status.QUEUED: frozenset({Status.RUNNING, Status.WAITING, Status.CANCELLED, Status.STOPPED}),
    Status.RUNNING: frozenset(
        {
            Status.WAITING,
            Status.COMPLETED,
            Status.FAILED,
            Status.CANCELLED,
            Status.STOPPED,
            # the attempt ended without finishing: clean shutdown or lost lease
            Status.QUEUED,
        }
    ),
    Status.WAITING: frozenset({Status.QUEUED, Status.CANCELLED, Status.STOPPED}),
    # Terminal states are absorbing.
    Status.COMPLETED: frozenset(),
    Status.FAILED: frozenset(),
    Status.CANCELLED: frozenset(),
    Status.STOPPED: frozenset(),
}


class FailCode(StrEnum):
    AGENT_ERROR = "agent_error"
    WORKER_LOST = "worker_lost"
    INVALID_OUTPUT = "invalid_output"
    # A write of the attempt failed for a reason other than its data, the fence or a transient
    # database error: the run cannot be said to have done what it did.
    STORAGE_ERROR = "storage_error"


class CancelCode(StrEnum):
    BY_USER = "cancelled_by_user"
    BY_STAFF = "cancelled_by_staff"
    PARENT_CANCELLED = "parent_cancelled"
    PARENT_ENDED = "parent_ended"
    # Its schedule fired again with the overlap policy cancel_other (docs/design/schedules.md#overlap).
    SCHEDULE_OVERLAP = "schedule_overlap"


class StopCode(StrEnum):
    STAFF = "staff"
    POLICY = "policy"
    BUDGET_EXHAUSTED = "budget_exhausted"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    PARENT_STOPPED = "parent_stopped"


# The stop codes a caller may choose; the others are the platform's own.
CALLER_STOP_CODES: frozenset[StopCode] = frozenset(
    {StopCode.STAFF, StopCode.POLICY, StopCode.BUDGET_EXHAUSTED, StopCode.DEADLINE_EXCEEDED}
)

END_CODES: dict[Status, frozenset[str]] = {
    Status.COMPLETED: frozenset({""}),
    Status.FAILED: frozenset(FailCode),
    Status.CANCELLED: frozenset(CancelCode),
    Status.STOPPED: frozenset(StopCode),
}


def is_terminal(status: str) -> bool:
    return status in TERMINAL


def can_transition(current: str, target: str) -> bool:
    return Status(target) in ALLOWED[Status(current)]


def check_transition(current: str, target: str) -> None:
    if not can_transition(current, target):
        raise InvalidTransition(current, target)


def descendant_end(parent_status: str) -> tuple[Status, str]:
    """How an unfinished descendant ends when its ancestor reaches `parent_status`
    (docs/design/commands.md#children)."""
    if parent_status == Status.CANCELLED:
        return Status.CANCELLED, CancelCode.PARENT_CANCELLED
    if parent_status == Status.STOPPED:
        return Status.STOPPED, StopCode.PARENT_STOPPED
    if parent_status in (Status.COMPLETED, Status.FAILED):
        return Status.CANCELLED, CancelCode.PARENT_ENDED
    raise ValueError(f"{parent_status} is not terminal")


# What each end code says, for the reference (docs/reference/errors.md is rendered from this).
END_CODE_MEANINGS: dict[str, str] = {
    FailCode.AGENT_ERROR: "the agent failed or raised",
    FailCode.INVALID_OUTPUT: "it produced what cannot be stored, or an event type it did not declare",
    FailCode.STORAGE_ERROR: "a write of its attempt failed otherwise",
    FailCode.WORKER_LOST: "`max_attempts` attempts lost their worker",
    CancelCode.BY_USER: "the owner (or a caller allowed to) cancelled it",
    CancelCode.BY_STAFF: "a holder of `runs.cancel_run` cancelled someone else's run",
    CancelCode.PARENT_CANCELLED: "its parent was cancelled",
    CancelCode.PARENT_ENDED: "its parent completed or failed while it was unfinished",
    CancelCode.SCHEDULE_OVERLAP: "its schedule fired again, with the overlap policy `cancel_other`",
    StopCode.STAFF: "staff stopped it",
    StopCode.POLICY: "a policy of the host stopped it",
    StopCode.BUDGET_EXHAUSTED: "it reached `max_steps` or `max_events`",
    StopCode.DEADLINE_EXCEEDED: "its `deadline` passed",
    StopCode.PARENT_STOPPED: "its parent was stopped",
}
