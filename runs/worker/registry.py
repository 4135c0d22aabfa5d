"""The attempts a worker executes, keyed by run and generation.

Signals for a run (cancel, pause) are delivered to the attempt of the generation they were
decided for, and an attempt unregisters only itself: a stale attempt that finishes late can never
remove — or receive the signals of — a newer attempt of the same run.
"""

from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar
from uuid import UUID

from runs.agents.base import CancellationToken


class Held(Protocol):
    run_id: UUID
    generation: int
    token: CancellationToken

    def request_pause(self) -> None: ...


H = TypeVar("H", bound=Held)


class AttemptRegistry(Generic[H]):
    def __init__(self) -> None:
        self._by_run: dict[UUID, H] = {}

    def __len__(self) -> int:
        return len(self._by_run)

    def __iter__(self) -> Iterator[H]:
        return iter(list(self._by_run.values()))

    def register(self, held: H) -> None:
        current = self._by_run.get(held.run_id)
        if current is not None and current.generation > held.generation:
            raise ValueError(f"run {held.run_id} already holds newer attempt {current.generation}")
        if current is not None:
            # A newer claim of the same run supersedes the old attempt, which must stop.
            current.token.trip("superseded by a newer attempt")
        self._by_run[held.run_id] = held

    def unregister(self, run_id: UUID, generation: int) -> bool:
        current = self._by_run.get(run_id)
        if current is None or current.generation != generation:
            return False
        del self._by_run[run_id]
        return True

    def get(self, run_id: UUID, generation: int | None = None) -> H | None:
        current = self._by_run.get(run_id)
        if current is None or (generation is not None and current.generation != generation):
            return None
        return current

    def trip(self, run_id: UUID, generation: int, reason: str) -> bool:
        held = self.get(run_id, generation)
        if held is None:
            return False
        held.token.trip(reason)
        return True

    def request_pause(self, run_id: UUID, generation: int) -> bool:
        held = self.get(run_id, generation)
        if held is None:
            return False
        held.request_pause()
        return True
