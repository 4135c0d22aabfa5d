"""What an agent produces, checked in the worker before anything of it is queued for writing.

Event data, the output of `Complete`, the reason and error of `Fail`, the prompt of `Wait` and the
input of a child run pass the same check as request input (runs.storable: finite numbers, no NUL,
no unpaired surrogates, bounded depth, and the request body's size bound). A directive that fails
it fails the run `invalid_output`, with a reason naming what was wrong and where: the events the
agent emitted before it are stored, nothing after it.
"""

import logging
from typing import Any

from runs.agents.base import Complete, Emit, Fail, Wait
from runs.conf import conf
from runs.events import EventType, ToolStatus, WaitReason, agent_event_problem, usage_problem
from runs.storable import storable_text, value_problem

log = logging.getLogger(__name__)


def _max_bytes() -> int:
    return conf.MAX_BODY_BYTES


def emit_problem(index: int, directive: Emit, declared: frozenset[str]) -> str | None:
    """Why the agent's event number `index` (counted from 0 in this attempt) cannot be stored."""
    what = f"event {index} ({storable_text(str(directive.type), max_chars=80)})"
    if not isinstance(directive.data, dict):
        return f"{what}: its data is a {type(directive.data).__name__}, not a JSON object"
    problem = agent_event_problem(directive.type, directive.data, declared)
    if problem is not None:
        return f"{what}: {problem}"
    problem = value_problem(directive.data, max_bytes=_max_bytes())
    return None if problem is None else f"{what}: its data cannot be stored: {problem}"


def usage_at_stop_kept(counters: Any, *, label: str) -> bool:
    """Whether a usage report made at stop (`AgentContext.report_usage_at_stop`) passes the rule of
    a `usage.reported` event's data; one that does not is logged and dropped (the run has ended:
    there is nothing left to fail)."""
    problem = usage_problem(counters) if isinstance(counters, dict) else "it is not a JSON object"
    if problem is not None:
        log.warning("%s: a usage report at stop was dropped: %s", label, problem)
    return problem is None


def event_data(directive: Emit) -> dict[str, Any]:
    if directive.type == EventType.TOOL_FINISHED and "status" not in directive.data:
        # Agents written before tool statuses existed: a result is `ok`, an `error` is an error.
        return {**directive.data, "status": ToolStatus.ERROR if "error" in directive.data else ToolStatus.OK}
    return directive.data


def _text_problem(name: str, value: Any) -> str | None:
    if not isinstance(value, str):
        return f"the {name} is a {type(value).__name__}, not a string"
    problem = value_problem(value, max_bytes=_max_bytes())
    return None if problem is None else f"the {name} cannot be stored: {problem}"


def _value_problem(name: str, value: Any) -> str | None:
    problem = value_problem(value, max_bytes=_max_bytes())
    return None if problem is None else f"the {name} cannot be stored: {problem}"


def ending_problem(directive: Complete | Fail | Wait) -> str | None:
    """Why the run cannot end (or wait) as the agent said."""
    if isinstance(directive, Complete):
        return _value_problem("output", directive.output)
    if isinstance(directive, Fail):
        return _text_problem("fail reason", directive.reason) or _value_problem("fail error", directive.error)
    if directive.reason not in tuple(WaitReason):
        return f"unknown wait reason {storable_text(repr(directive.reason), max_chars=80)}"
    return _value_problem("wait prompt", directive.prompt)


def child_input_problem(input: Any) -> str | None:
    if not isinstance(input, dict):
        return f"a child's input is a {type(input).__name__}, not a JSON object"
    return _value_problem("child's input", input)


def raised(error: BaseException) -> tuple[str, dict[str, str]]:
    """The reason and error a run fails with when its agent raised `error`: its message is the
    agent's text too, made storable rather than refused (the run fails either way)."""
    name = type(error).__name__
    message = storable_text(str(error))
    return f"the agent raised {name}: {message}", {"type": name, "message": message}
