"""What an attempt's agent sees of it (`runs.agents.AgentContext`, docs/design/execution.md#agents):
the run's input and stored events, the token, and the steps, child runs, processes, threads and
HTTP streams it starts through the attempt."""

import asyncio
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, ParamSpec, Protocol, TypeVar
from uuid import UUID

import httpx

from runs.agents.base import CancellationToken, Cancelled, StoredEvent
from runs.agents.retry import DEFAULT_RETRY, Retry
from runs.exceptions import StaleAttempt
from runs.transitions import FailCode
from runs.worker import checks
from runs.worker.db import TRANSIENT_DB_ERRORS
from runs.worker.durable import DurableSteps
from runs.worker.steps import Steps
from runs.worker.writer import EventWriter

P = ParamSpec("P")
T = TypeVar("T")


class Execution(Protocol):
    """What the context reads of its attempt (runs.worker.attempt.Execution), named here so that the
    attempt imports the context and not the other way round."""

    run_id: UUID
    generation: int
    input: dict[str, Any]
    token: CancellationToken
    is_child: bool
    writer: EventWriter
    steps: Steps
    durable: DurableSteps
    usage_at_stop: dict[str, Any] | None

    def stop(self, reason: str, *, via: str) -> None: ...


class AttemptContext:
    """`runs.agents.base.AgentContext`, for one attempt."""

    def __init__(self, execution: Execution, events: Sequence[StoredEvent]) -> None:
        self._execution = execution
        self.run_id: UUID = execution.run_id
        self.generation: int = execution.generation
        self.input: dict[str, Any] = execution.input
        self.events: Sequence[StoredEvent] = events
        self.token: CancellationToken = execution.token
        self.is_child: bool = execution.is_child

    async def step(
        self, name: str, fn: Callable[..., Any], /, *args: Any, retry: Retry = DEFAULT_RETRY, **kwargs: Any
    ) -> Any:
        return await self._execution.durable.step(name, fn, args, kwargs, retry)

    async def retry_wait(self, name: str, error: BaseException, *, call: int, retry: Retry = DEFAULT_RETRY) -> float:
        return await self._execution.durable.retry_wait(name, error, call=call, retry=retry)

    @property
    def step_key(self) -> str | None:
        return self._execution.durable.key

    async def spawn_child(self, input: dict[str, Any], *, metadata: dict[str, str] | None = None) -> UUID:
        ex = self._execution
        problem = checks.child_input_problem(input)
        if problem is not None:
            await ex.writer.drain()  # what the agent emitted before it is stored; nothing after
            ex.writer.fail(FailCode.INVALID_OUTPUT, problem)
            raise Cancelled(problem)
        if ex.durable.replay.active and (spawned := ex.durable.replay.child()) is not None:
            return spawned  # spawned by an earlier attempt before the step it replays to
        try:
            child = await ex.writer.spawn_child(input, metadata=metadata)
        except StaleAttempt as exc:
            ex.stop(exc.message, via="spawn")
            raise Cancelled(ex.token.reason) from exc
        except TRANSIENT_DB_ERRORS as exc:  # `commit` gives up on these only once the token tripped
            raise Cancelled(ex.token.reason) from exc
        return child.pk

    async def start_process(
        self, program: str | os.PathLike[str], *args: Any, **kwargs: Any
    ) -> asyncio.subprocess.Process:
        return await self._execution.steps.start_process(program, *args, **kwargs)

    async def to_thread(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._execution.steps.to_thread(fn, *args, **kwargs)

    def http_stream(
        self, method: str, url: httpx.URL | str, *, client: httpx.AsyncClient | None = None, **kwargs: Any
    ) -> AbstractAsyncContextManager[httpx.Response]:
        return self._execution.steps.http_stream(method, url, client=client, **kwargs)

    def report_usage_at_stop(self, counters: dict[str, Any]) -> None:
        if checks.usage_at_stop_kept(counters, label=repr(self._execution)):
            self._execution.usage_at_stop = dict(counters)
