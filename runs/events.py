"""The event vocabulary (docs/design/events.md#types): every event type the platform knows, the
terminal event of each terminal status, wait reasons and requeue causes.

This is the one module that spells them. Python code names them through these enums; the watch
page's script receives `browser_vocabulary()` from the page (a JSON script tag), so no template nor
page script spells an event type either. @runledger/client spells the terminal types and
`output.delta`, checked against these by tests/client/test_js_static.py.
"""

import re
import sys
from collections.abc import Iterable
from enum import StrEnum
from typing import Any

from runs.exceptions import ValidationFailed
from runs.transitions import Status


class EventType(StrEnum):
    RUN_CREATED = "run.created"
    RUN_STARTED = "run.started"
    OUTPUT_DELTA = "output.delta"
    TOOL_STARTED = "tool.started"
    TOOL_FINISHED = "tool.finished"
    CHILD_SPAWNED = "child.spawned"
    USAGE_REPORTED = "usage.reported"
    STEP_COMPLETED = "step.completed"
    STEP_RETRYING = "step.retrying"
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


class ScheduleEvent(StrEnum):
    """What a schedule tells webhooks of, beside its runs' own events (docs/design/schedules.md#webhooks):
    not events of a run's log."""

    # A due time the overlap policy did not fire (its last run still live).
    SKIPPED = "schedule.skipped"
    # A due time whose run could not be created (the owner's caps, an agent gone).
    FAILED = "schedule.failed"


class FireOutcome(StrEnum):
    """What one due time of a schedule did (runs.services.firing; the metric's label)."""

    CREATED = "created"
    SKIPPED = "skipped"
    BUFFERED = "buffered"
    FAILED = "failed"
    # Its run existed already (a trigger's or a backfill's at the same instant): none created.
    EXISTS = "exists"
    # Passed over by catch-up: older than the window when a later one fired.
    MISSED = "missed"


# The events a webhook endpoint may be sent (docs/design/webhooks.md): a run's end and its waits,
# and what schedules could not do.
WEBHOOK_EVENTS: tuple[str, ...] = (
    EventType.RUN_COMPLETED,
    EventType.RUN_FAILED,
    EventType.RUN_CANCELLED,
    EventType.RUN_STOPPED,
    EventType.RUN_WAITING,
    ScheduleEvent.SKIPPED,
    ScheduleEvent.FAILED,
)

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


# Platform types an agent emits itself (the rest of `EventType` only the platform writes).
AGENT_TYPES: frozenset[str] = frozenset(
    {EventType.OUTPUT_DELTA, EventType.TOOL_STARTED, EventType.TOOL_FINISHED, EventType.USAGE_REPORTED}
)

# The key of the terminal events of a run that did not complete saying whether it has a partial output
# (docs/design/execution.md#partial-output).
PARTIAL_OUTPUT = "partial_output"

# `usage.reported` (docs/design/events.md#usage): counters named like this, whole or decimal numbers ≥ 0,
# summed into the run; and the flag an agent sets when it could not learn them all.
USAGE_COUNTER = re.compile(r"[a-z][a-z0-9_]{0,39}")
USAGE_INCOMPLETE = "incomplete"
# The platform's own counters in a run's `usage` (its steps_used and events_used): no agent's.
USAGE_PLATFORM = ("steps", "events")
# The largest a counter, or its sum over a run, may be: the largest finite number every reader of
# JSON holds (a double). A sum that would pass it stays at it, and `usage` lists the counter under
# USAGE_SATURATED (also no agent's counter): the run goes on.
USAGE_MAX = sys.float_info.max
USAGE_SATURATED = "saturated"
# Bounded, as each counter becomes a label of /metrics/ (runledger_usage_total{agent,counter}).
USAGE_COUNTERS_MAX = 20

# The shape of a type an agent declares for itself (docs/design/events.md#agent-types): dotted,
# lower case, e.g. `plan.updated`.
CUSTOM_TYPE = re.compile(r"[a-z][a-z0-9_]*(\.[a-z0-9_]+)+")


# The longest type `RunEvent.type` stores.
TYPE_MAX = 64


def custom_type_problem(type_: object) -> str | None:
    """Why `type_` cannot be an agent's own event type, or None if it can."""
    if not isinstance(type_, str) or len(type_) > TYPE_MAX or not CUSTOM_TYPE.fullmatch(type_):
        return f"{type_!r} is not an event type (lower-case dotted words, e.g. 'plan.updated')"
    if type_ in EventType._value2member_map_:
        return f"{type_!r} is a type of the platform; agents declare only types of their own"
    return None


class ToolStatus(StrEnum):
    """How a tool call ended (the `status` of `tool.finished`)."""

    OK = "ok"
    ERROR = "error"
    # Written by the platform only: the run ended while the call was open.
    INTERRUPTED = "interrupted"


def usage_problem(data: dict[str, Any]) -> str | None:
    """Why `data` is not the data of a `usage.reported` event, or None."""
    counters = [key for key in data if key != USAGE_INCOMPLETE]
    if len(counters) > USAGE_COUNTERS_MAX:
        return f"a usage.reported event has at most {USAGE_COUNTERS_MAX} counters, not {len(counters)}"
    if USAGE_INCOMPLETE in data and not isinstance(data[USAGE_INCOMPLETE], bool):
        return "a usage.reported incomplete is true or false"
    for key in counters:
        value = data[key]
        if not isinstance(key, str) or not USAGE_COUNTER.fullmatch(key):
            return f"a usage counter is named in lower-case words joined by _ (at most 40 characters), not {key!r}"
        if key in USAGE_PLATFORM or key == USAGE_SATURATED:
            return f"usage counter {key!r} is the platform's own"
        # Compared exactly, so an integer of any length is refused, never converted (and never
        # written out: Python refuses to print one of over 4,300 digits).
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= USAGE_MAX:
            shown = repr(value) if not isinstance(value, int) or value.bit_length() < 64 else "a larger number"
            return f"usage counter {key!r} must be a number from 0 to {USAGE_MAX:.4g}, not {shown}"
    return None


def agent_event_problem(type_: object, data: dict[str, Any], declared: frozenset[str]) -> str | None:
    """Why an agent may not emit this event, or None. It may emit the platform's `AGENT_TYPES`
    and the types of its own it declared when it registered (docs/design/events.md#agent-types)."""
    if type_ == EventType.USAGE_REPORTED:
        return usage_problem(data)
    if type_ == EventType.OUTPUT_DELTA:
        # Its text is the run's partial output, joined (docs/design/execution.md#partial-output).
        if isinstance(data.get("text"), str):
            return None
        given = f"a {type(data['text']).__name__}" if "text" in data else "none"
        return f"an output.delta needs a text that is a string, not {given}"
    if type_ in AGENT_TYPES:
        call_id = data.get("call_id")
        if not isinstance(call_id, str) or not call_id:
            return f"{type_} events need a call_id (a non-empty string)"
        status = data.get("status", ToolStatus.OK)
        if type_ == EventType.TOOL_FINISHED and status not in (ToolStatus.OK, ToolStatus.ERROR):
            return f"a tool.finished status is 'ok' or 'error', not {status!r}"
        return None
    if isinstance(type_, str) and type_ in EventType._value2member_map_:
        return f"an agent cannot emit {type_!r} events"
    if isinstance(type_, str) and type_ in declared:
        return None
    return custom_type_problem(type_) or f"the agent emitted {type_!r}, a type it did not declare"


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


def browser_vocabulary(declared: Iterable[str] = ()) -> dict[str, Any]:
    """What the watch page's script (runs/static/runs/watch.js) knows of events: every type by its
    Python name, the types the run's agent declared, the status each terminal type ends a run in,
    the wait reasons and the tool statuses."""
    return {
        "types": {member.name: member.value for member in EventType},
        "declared": sorted(declared),
        "terminal": {event.value: status.value for status, event in TERMINAL_EVENT.items()},
        "waitReasons": {member.name: member.value for member in WaitReason},
        "toolStatuses": {member.name: member.value for member in ToolStatus},
    }


# The key a fork's copy of an original's event adds to its data: the seq it had in the original
# (docs/design/commands.md#fork).
FORKED_FROM_SEQ = "forked_from_seq"
FORKED_FROM_SEQ_MEANING = "a fork's copy only: the event's seq in the run it was copied from"


# What a fork's copy of a `run.resumed` leaves out: the original's ticket, spent, never the fork's.
RESUMED_TICKET = "ticket"


def forkable_types(declared: Iterable[str]) -> frozenset[str]:
    """The types a fork copies from its original (docs/design/commands.md#fork): what the agent
    emitted — the platform's agent types and the agent's own `declared` ones — and the questions it
    asked with their answers (`run.waiting`, `run.resumed`), so that it continues with the answer;
    never the rest of the platform's record of the run's life nor its children, nor what the
    original used (its `usage.reported`: the fork did not use it)."""
    return (
        (AGENT_TYPES - {EventType.USAGE_REPORTED})
        | {EventType.RUN_WAITING, EventType.RUN_RESUMED, EventType.STEP_COMPLETED}
        | frozenset(declared)
    )


PARTIAL_OUTPUT_MEANING = "true when the run's `partial_output` is not null (the run JSON has it)"

# What each event's `data` holds, for the reference (docs/reference/events.md is rendered from this;
# tests/docs/test_docs_reference.py drives runs through every platform type and compares the keys). For
# the types an agent emits, the keys the platform requires or writes; the agent may add its own.
EVENT_DATA: dict[EventType, tuple[str, dict[str, str]]] = {
    EventType.RUN_CREATED: (
        "The run was accepted (always seq 1).",
        {
            "agent": "the agent's name",
            "input_keys": "the input's top-level keys, sorted (never its values)",
            "parent": "the parent run's id, or null",
            "rerun_of": "a rerun's only: the id of the run it runs again",
            "from_seq": "a rerun's only: the seq its fork copied the original's events up to, or null (no fork)",
        },
    ),
    EventType.RUN_STARTED: (
        "A worker's attempt claimed the run.",
        {
            "generation": "the attempt's number (1, 2, …); it fences the attempt's writes",
            "worker": "the worker that holds it",
        },
    ),
    EventType.OUTPUT_DELTA: (
        "A piece of the agent's text output.",
        {"text": "required: the piece, a string", FORKED_FROM_SEQ: FORKED_FROM_SEQ_MEANING},
    ),
    EventType.TOOL_STARTED: (
        "The agent began a tool call (or a subprocess, or a model request).",
        {
            "call_id": "required: a non-empty string naming the call; its tool.finished repeats it",
            "name": "the tool's name",
            FORKED_FROM_SEQ: FORKED_FROM_SEQ_MEANING,
        },
    ),
    EventType.TOOL_FINISHED: (
        "A tool call ended.",
        {
            "call_id": "required: the call_id of its tool.started",
            "name": "the tool's name",
            "status": "`ok` (the default), `error`, or `interrupted` (written by the platform when the run "
            "ended while the call was open)",
            FORKED_FROM_SEQ: FORKED_FROM_SEQ_MEANING,
        },
    ),
    EventType.CHILD_SPAWNED: (
        "The agent created a child run (exactly once per step, whatever the retries).",
        {"run_id": "the child's id", "agent": "the child's agent"},
    ),
    EventType.USAGE_REPORTED: (
        "What the agent used (e.g. model tokens), summed into the run's `usage`; never copied by a fork.",
        {
            "<counter>": "any number of counters (lower-case words joined by _, e.g. `input_tokens`), each a "
            "number from 0 to 1.8e308 (the largest finite double)",
            USAGE_INCOMPLETE: "optional: true when the agent could not learn all it used",
        },
    ),
    EventType.STEP_COMPLETED: (
        "A durable step's result, stored before `ctx.step` returned it; a later attempt gets it without "
        "calling the step again (docs/design/execution.md#steps).",
        {
            "name": "the step's name",
            "ordinal": "its place among the run's steps (1, 2, …): the same name may repeat",
            "result": "what the step returned, as JSON",
            FORKED_FROM_SEQ: FORKED_FROM_SEQ_MEANING,
        },
    ),
    EventType.STEP_RETRYING: (
        "A call of a durable step failed with an error its retry policy retries; the next call follows the wait.",
        {
            "name": "the step's name",
            "ordinal": "its place among the run's steps; null for a retry the agent drives itself (`ctx.retry_wait`)",
            "call": "the call that failed (1 for the first)",
            "error": "the error's class",
            "message": "the error's message",
            "wait": "seconds until the next call",
        },
    ),
    EventType.RUN_WAITING: (
        "The run paused or asks for input; it holds a resume ticket and no worker holds it.",
        {
            "reason": "`paused` or `input_required`",
            "prompt": "what the agent asks (input_required), or null",
            FORKED_FROM_SEQ: FORKED_FROM_SEQ_MEANING,
        },
    ),
    EventType.RUN_RESUMED: (
        "A resume with the run's ticket was accepted; the run is queued again.",
        {
            RESUMED_TICKET: "the ticket it was resumed with (now spent); not in a fork's copy",
            "input": "the input given to the agent, or null",
            FORKED_FROM_SEQ: FORKED_FROM_SEQ_MEANING,
        },
    ),
    EventType.RUN_REQUEUED: (
        "An attempt ended without finishing; the run is queued again.",
        {
            "generation": "the attempt that ended",
            "cause": "`worker_shutdown` (a clean shutdown, not counted) or `lease_expired` (a lost attempt)",
        },
    ),
    EventType.RUN_COMPLETED: ("Terminal: the agent finished.", {"output": "its result (also the run's `output`)"}),
    EventType.RUN_FAILED: (
        "Terminal: the run failed.",
        {
            "code": "the end code",
            "reason": "a sentence for people",
            "error": "details as JSON, or null",
            PARTIAL_OUTPUT: PARTIAL_OUTPUT_MEANING,
        },
    ),
    EventType.RUN_CANCELLED: (
        "Terminal: an explicit, authorised cancel (never a dropped connection).",
        {
            "code": "the end code",
            "note": "the canceller's note (may be empty)",
            "by": "who cancelled",
            PARTIAL_OUTPUT: PARTIAL_OUTPUT_MEANING,
        },
    ),
    EventType.RUN_STOPPED: (
        "Terminal: a policy end (staff, budgets, the deadline, a stopped parent).",
        {
            "code": "the end code",
            "reason": "why",
            "by": "who or what stopped it",
            PARTIAL_OUTPUT: PARTIAL_OUTPUT_MEANING,
        },
    ),
}


# What a stream or a page of events may be narrowed to (docs/design/streaming.md#types): `?types=`
# lists exact types and `prefix.*`, comma-separated.
TYPES_WILDCARD = ".*"
TYPES_HELP = (
    "only events of these types, comma-separated: exact names (`output.delta`) and prefixes (`run.*`), "
    "the run's terminal event always included; seqs and cursors stay the run's"
)


class TypeSelection:
    """The types a watcher asked for. The terminal events are always in it: a client must learn
    that the run ended, whatever it chose."""

    __slots__ = ("exact", "prefixes")

    def __init__(self, exact: Iterable[str], prefixes: Iterable[str]) -> None:
        self.exact: frozenset[str] = frozenset(exact) | TERMINAL_EVENT_TYPES
        # Each with its dot ("run."), so "run.*" never takes "runner.x".
        self.prefixes: tuple[str, ...] = tuple(sorted(set(prefixes)))

    def __contains__(self, type_: str) -> bool:
        return type_ in self.exact or type_.startswith(self.prefixes)


def type_selection(spec: str, declared: Iterable[str] = ()) -> TypeSelection:
    """`spec` (`output.delta,run.*`) as a selection, against the platform's types and the types of
    its own the run's agent `declared`; a 400 naming every name that matches none."""
    known = {member.value for member in EventType} | set(declared)
    names = [name.strip() for name in spec.split(",") if name.strip()]
    if not names:
        raise _bad_types("name at least one event type, or leave `types` out for every event")
    exact: list[str] = []
    prefixes: list[str] = []
    unknown: list[str] = []
    for name in names:
        if name.endswith(TYPES_WILDCARD):
            prefix = name[: -len(TYPES_WILDCARD)] + "."
            prefixes.append(prefix)
            found = any(type_.startswith(prefix) for type_ in known)
        else:
            exact.append(name)
            found = name in known
        if not found:
            unknown.append(name)
    if unknown:
        raise _bad_types(f"unknown event types: {', '.join(unknown)}")
    return TypeSelection(exact, prefixes)


def _bad_types(message: str) -> ValidationFailed:
    return ValidationFailed(message, detail={"types": [message]})
