"""The event vocabulary of DESIGN §2: every event type the platform knows, the terminal event of
each terminal status, wait reasons and requeue causes.

This is the one module that spells them. Python code names them through these enums; the browser
clients receive `browser_vocabulary()` from the page (a JSON script tag), so no JavaScript or
template spells an event type either.
"""

from enum import StrEnum
from typing import Any

from runs.transitions import Status


class EventType(StrEnum):
    RUN_CREATED = "run.created"
    RUN_STARTED = "run.started"
    OUTPUT_DELTA = "output.delta"
    TOOL_STARTED = "tool.started"
    TOOL_FINISHED = "tool.finished"
    CHILD_SPAWNED = "child.spawned"
    RUN_WAITING = "run.waiting"
    RUN_RESUMED = "run.resumed"
    RUN_REQUEUED = "run.requeued"
    RUN_COMPLETED = "run.completed"
    RUN_FAILED = "run.failed"
    RUN_CANCELLED = "run.cancelled"
    RUN_STOPPED = "run.stopped"


# The one terminal event of each terminal status; it is always a run's last event.
TERMINAL_EVENT: dict[Status, EventType] = {
    Status.COMPLETED: EventType.RUN_COMPLETED,
    Status.FAILED: EventType.RUN_FAILED,
    Status.CANCELLED: EventType.RUN_CANCELLED,
    Status.STOPPED: EventType.RUN_STOPPED,
}

TERMINAL_EVENT_TYPES: frozenset[str] = frozenset(TERMINAL_EVENT.values())

# Types only the platform writes; an agent may not emit them.
LIFECYCLE_TYPES: frozenset[str] = frozenset(
    {
        EventType.RUN_CREATED,
        EventType.RUN_STARTED,
        EventType.RUN_WAITING,
        EventType.RUN_RESUMED,
        EventType.RUN_REQUEUED,
        *TERMINAL_EVENT_TYPES,
    }
)


class WaitReason(StrEnum):
    """Why a run is `waiting` (the `reason` of `run.waiting`)."""

    PAUSED = "paused"
    INPUT_REQUIRED = "input_required"


class RequeueCause(StrEnum):
    """Why an attempt ended without finishing (the `cause` of `run.requeued`)."""

    # A clean shutdown of its worker: not counted against `max_attempts`.
    WORKER_SHUTDOWN = "worker_shutdown"
    # Its lease lapsed (the worker died, stalled or lost the database): one more lost attempt.
    LEASE_EXPIRED = "lease_expired"


def browser_vocabulary() -> dict[str, Any]:
    """What the browser stream client (runs/static/runs/stream.js) knows of events: every type by
    its Python name, the status each terminal type ends a run in, and the wait reasons."""
    return {
        "types": {member.name: member.value for member in EventType},
        "terminal": {event.value: status.value for status, event in TERMINAL_EVENT.items()},
        "waitReasons": {member.name: member.value for member in WaitReason},
    }
