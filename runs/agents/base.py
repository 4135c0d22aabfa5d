"""The agent interface (docs/design/execution.md#agents): the directives an agent yields (`Emit`,
`Step`, `Wait`, `Complete`, `Fail`), its context (`AgentContext`: the input, the stored events, the
cancellation token, and the child processes, threads and HTTP streams that stop with the attempt:
docs/design/execution.md#step-kinds) and the registry of agents by name. How to write one, with
every guarantee an agent may rely on: docs/how-to/agents.md."""

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar
from uuid import UUID

from runs.agents.retry import Retry
from runs.events import EventType, custom_type_problem

if TYPE_CHECKING:
    # Only worker processes load httpx; the web processes import this module too.
    import httpx

P = ParamSpec("P")
T = TypeVar("T")


class Cancelled(Exception):
    """The attempt's token tripped while the agent awaited something it raced against it."""


class CancellationToken:
    """Trips once, for the one attempt it belongs to; awaiting code races its work against it."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.reason = ""

    @property
    def tripped(self) -> bool:
        return self._event.is_set()

    def trip(self, reason: str) -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    async def wait(self) -> None:
        await self._event.wait()

    async def race(self, awaitable: Awaitable[T]) -> T:
        """Await `awaitable` unless the token trips first; then cancel it and raise `Cancelled`."""
        if self.tripped:
            if asyncio.iscoroutine(awaitable):
                awaitable.close()
            raise Cancelled(self.reason)
        work = asyncio.ensure_future(awaitable)
        tripped = asyncio.ensure_future(self._event.wait())
        try:
            await asyncio.wait({work, tripped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            tripped.cancel()
            if not work.done():
                work.cancel()
                # Let it unwind (close what it opened) before the caller goes on.
                await asyncio.wait({work})
        if work.done() and not work.cancelled():
            return work.result()
        raise Cancelled(self.reason)


@dataclass(frozen=True)
class Emit:
    type: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    kind: str = "model"


@dataclass(frozen=True)
class Wait:
    reason: str
    prompt: str | None = None


@dataclass(frozen=True)
class Complete:
    output: Any = None


@dataclass(frozen=True)
class Fail:
    reason: str
    error: Any = None


Directive = Emit | Step | Wait | Complete | Fail


@dataclass(frozen=True)
class StoredEvent:
    seq: int
    type: str
    data: dict[str, Any]
    attempt: int | None = None


class AgentContext(Protocol):
    run_id: UUID
    # The generation of this attempt (1 for the first).
    generation: int
    input: dict[str, Any]
    # Every event stored for the run when this attempt started, in seq order.
    events: Sequence[StoredEvent]
    token: CancellationToken
    is_child: bool

    def step(
        self, name: str, fn: Callable[..., Any], /, *args: Any, retry: Retry = ..., **kwargs: Any
    ) -> Awaitable[Any]:
        """A durable step (docs/design/execution.md#steps): `fn(*args, **kwargs)` — awaited if it is a
        coroutine function, in a thread (`to_thread`) otherwise — called until it returns, retried
        by `retry` (default `Retry()`), its JSON result stored as `step.completed` before it is
        returned. A later attempt reaching the same step gets the stored result without calling
        `fn`. Steps run one at a time, each one step toward `max_steps`, each retry one more."""
        ...

    def retry_wait(self, name: str, error: BaseException, *, call: int, retry: Retry = ...) -> Awaitable[float]:
        """For work that cannot be a step (a stream whose pieces are emitted as they come): call
        number `call` of `name` failed with `error` and is to be tried again. Counted one step,
        recorded as `step.retrying` (its `ordinal` null), then the wait `retry` draws (at least the
        error's `retry_after`), which a cancel ends at once (`Cancelled`). Returns the wait."""
        ...

    @property
    def step_key(self) -> str | None:
        """While a step's `fn` runs: its idempotency key (the run's id and the step's ordinal), the
        same on every call of that step in every attempt, for the services it calls."""
        ...

    def spawn_child(self, input: dict[str, Any], *, metadata: dict[str, str] | None = None) -> Awaitable[UUID]:
        """Create a child run of the same agent, owned by this run's owner, with this run's metadata
        unless `metadata` is given. The parent's
        `EventType.CHILD_SPAWNED` event records it in the same transaction, so a later attempt sees it in
        `events` and never spawns it twice."""
        ...

    def start_process(
        self, program: str | os.PathLike[str], *args: Any, **kwargs: Any
    ) -> Awaitable[asyncio.subprocess.Process]:
        """`asyncio.create_subprocess_exec` in a process group of its own, which the attempt
        terminates (SIGTERM, then SIGKILL after the grace) and reaps when it stops."""
        ...

    def to_thread(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Awaitable[T]:
        """`fn(*args, **kwargs)` in a thread of its own; on stop the await ends at once and the
        thread, which cannot be interrupted, is abandoned after the grace."""
        ...

    def http_stream(
        self, method: str, url: "httpx.URL | str", *, client: "httpx.AsyncClient | None" = None, **kwargs: Any
    ) -> "AbstractAsyncContextManager[httpx.Response]":
        """A streamed HTTP response (`httpx.AsyncClient.stream`), closed with its connection when
        the attempt stops."""
        ...

    def report_usage_at_stop(self, counters: dict[str, Any]) -> None:
        """What the agent used and could not emit as `usage.reported` because the run was cancelled
        or stopped under it (the data of such an event): added to the run when the attempt is
        released. The last report wins; a report the event's rule refuses is logged and dropped."""
        ...


Agent = Callable[[AgentContext], AsyncIterator[Directive]]
# Checks a new run's input before it is stored: {key: what is wrong with it}, empty when it is fine.
InputCheck = Callable[[dict[str, Any]], dict[str, str]]

# The rule of an agent's partial output (docs/design/execution.md#partial-output): each key of the
# object, the text of one data key of one event type, concatenated in seq order.
PartialOutput = Mapping[str, tuple[str, str]]
TEXT_OF_DELTAS: PartialOutput = MappingProxyType({"text": (EventType.OUTPUT_DELTA.value, "text")})


@dataclass(frozen=True)
class Registered:
    name: str
    agent: Agent
    # The agent's own event types (docs/design/events.md#agent-types); the platform's agent types
    # need no declaring.
    event_types: frozenset[str]
    check_input: InputCheck | None = None
    # None: the agent's output is never partial (its runs' partial_output is always null).
    partial_output: PartialOutput | None = field(default_factory=lambda: TEXT_OF_DELTAS)


_REGISTRY: dict[str, Registered] = {}

# The longest agent name a run can carry (`Run.agent`).
NAME_MAX = 64


def register(
    name: str,
    *,
    event_types: Iterable[str] = (),
    check_input: InputCheck | None = None,
    partial_output: PartialOutput | None = TEXT_OF_DELTAS,
) -> Callable[[Agent], Agent]:
    """Register an agent under `name`, with the event types of its own it may emit, the check
    a new run's input must pass (a create that fails it is a 400 naming the keys), and what its
    partial output is made of: {key: (event type, data key)}, the type `output.delta` or one of
    its own, e.g. `{"plan": ("plan.updated", "text")}`; None if it has none.

    A mistake here (a bad name or type, or a name another agent holds) raises at import, so the
    process that loads the module refuses to start instead of failing runs later."""
    if not isinstance(name, str) or not name or len(name) > NAME_MAX or name != name.strip():
        raise ValueError(f"an agent name must be 1 to {NAME_MAX} characters without surrounding spaces: {name!r}")
    if isinstance(event_types, str):
        raise ValueError(f"event_types of agent {name!r} must be a list of types, not one string")
    declared = frozenset(event_types)
    for type_ in sorted(declared, key=str):
        problem = custom_type_problem(type_)
        if problem is not None:
            raise ValueError(f"agent {name!r} declares {problem}")
    rule = None if partial_output is None else _partial_rule(name, partial_output, declared)

    def decorator(agent: Agent) -> Agent:
        held = _REGISTRY.get(name)
        if held is not None and _origin(held.agent) != _origin(agent):
            raise ValueError(f"agent name {name!r} is already registered by {'.'.join(_origin(held.agent))}")
        _REGISTRY[name] = Registered(
            name=name, agent=agent, event_types=declared, check_input=check_input, partial_output=rule
        )
        return agent

    return decorator


def _partial_rule(name: str, rule: PartialOutput, declared: frozenset[str]) -> PartialOutput:
    if not isinstance(rule, Mapping) or not rule:
        raise ValueError(f"partial_output of agent {name!r} must be a non-empty mapping, or None")
    for key, source in rule.items():
        if not isinstance(key, str) or not key or not isinstance(source, tuple) or len(source) != 2:
            raise ValueError(f"partial_output of agent {name!r}: {key!r} must map to (event type, data key)")
        type_, field_ = source
        if type_ != EventType.OUTPUT_DELTA and type_ not in declared:
            raise ValueError(f"partial_output of agent {name!r} reads {type_!r}, neither output.delta nor its own")
        if not isinstance(field_, str) or not field_:
            raise ValueError(f"partial_output of agent {name!r}: the data key of {key!r} must be a string")
    return MappingProxyType({key: (str(type_), field_) for key, (type_, field_) in rule.items()})


def _origin(agent: Agent) -> tuple[str, str]:
    # A module imported twice (e.g. as a script and as a module) registers the same function again.
    return (getattr(agent, "__module__", "?"), getattr(agent, "__qualname__", repr(agent)))


def is_registered(name: str) -> bool:
    return name in _REGISTRY


def get_agent(name: str) -> Agent:
    return _REGISTRY[name].agent


def declared_types(name: str) -> frozenset[str]:
    """The event types of its own the agent `name` declared (none for an unknown name)."""
    held = _REGISTRY.get(name)
    return held.event_types if held is not None else frozenset()


def partial_output_rule(name: str) -> PartialOutput | None:
    """How the partial output of a run of agent `name` is made (None: it has none). An agent no
    longer registered keeps the default: its runs' text is still there to show."""
    held = _REGISTRY.get(name)
    return held.partial_output if held is not None else TEXT_OF_DELTAS


def partial_output_types(name: str) -> frozenset[str]:
    """The event types whose appends make a partial output of a run of agent `name`."""
    rule = partial_output_rule(name)
    return frozenset(type_ for type_, _ in rule.values()) if rule else frozenset()


def input_problems(name: str, input: dict[str, Any]) -> dict[str, str]:
    """What the agent `name` finds wrong with `input` (nothing for an agent without a check)."""
    held = _REGISTRY.get(name)
    return held.check_input(input) if held is not None and held.check_input is not None else {}


def registered() -> list[Registered]:
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]


def registered_names() -> list[str]:
    return sorted(_REGISTRY)
