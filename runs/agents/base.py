"""The pluggable agent interface (DESIGN §4).

An agent is an async generator function taking an `AgentContext` and yielding directives:
`Emit` (an event to append), `Step` (one unit of the `max_steps` budget: a model turn or a tool
call), `Wait` (park the run for input), `Complete` or `Fail`. It observes `ctx.token` and stops at
its next await once the token trips. A new attempt gets the run's stored events in `ctx.events`,
so it continues from them instead of re-emitting what is already stored.
"""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from uuid import UUID


class CancellationToken:
    """Trips once; awaiting code races its work against `wait()`."""

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


class AgentContext(Protocol):
    run_id: UUID
    input: dict[str, Any]
    events: Sequence[StoredEvent]
    token: CancellationToken
    is_child: bool

    def spawn_child(self, input: dict[str, Any]) -> Awaitable[UUID]: ...


Agent = Callable[[AgentContext], AsyncIterator[Directive]]

_REGISTRY: dict[str, Agent] = {}


def register(name: str) -> Callable[[Agent], Agent]:
    def decorator(agent: Agent) -> Agent:
        _REGISTRY[name] = agent
        return agent

    return decorator


def is_registered(name: str) -> bool:
    return name in _REGISTRY


def get_agent(name: str) -> Agent:
    return _REGISTRY[name]


def registered_names() -> list[str]:
    return sorted(_REGISTRY)
