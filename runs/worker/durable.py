"""Durable steps (docs/design/execution.md#steps): `ctx.step` stores a step's result as
`step.completed` before it returns it, retries the step by its policy (`step.retrying`), and on a
later attempt gives the stored result back without calling the step; the replay matches what that
attempt emits again against the stored log (docs/design/execution.md#determinism).
"""

import asyncio
import inspect
import json
import random
from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

from runs.agents.base import CancellationToken, Cancelled, StoredEvent
from runs.agents.retry import Retry, StepFailed
from runs.conf import conf
from runs.events import AGENT_TYPES, FORKED_FROM_SEQ, EventType, ToolStatus, WaitReason
from runs.storable import storable_text, value_problem
from runs.transitions import FailCode
from runs.worker.steps import Steps
from runs.worker.writer import EventWriter

# The longest step name: it is stored in every one of its events.
NAME_MAX = 200


class StepHooks:
    """Where steps meet time and chance. The worker's are real; `runs.testing` passes a fake clock
    and injected failures."""

    def draw(self) -> float:
        """The jitter of a retry's wait, in [0, 1)."""
        return random.random()

    async def sleep(self, seconds: float, token: CancellationToken) -> None:
        """A retry's wait, which a cancel ends at once (`Cancelled`)."""
        await token.race(asyncio.sleep(seconds))

    async def before_call(self, name: str, ordinal: int, call: int) -> None:
        """Called before each call of a step: what it raises, the call raised."""

    async def after_completed(self, name: str, ordinal: int) -> None:
        """Called once a step's `step.completed` has committed, before `ctx.step` returns."""


def _checked_name(name: Any) -> str:
    if not isinstance(name, str) or not name or len(name) > NAME_MAX or value_problem(name) is not None:
        raise ValueError(f"a step's name is a string of 1 to {NAME_MAX} characters, not {name!r}")
    return name


def _json(value: Any) -> Any:
    """`value` as a JSON column gives it back (tuples become lists, and so on)."""
    return json.loads(json.dumps(value))


def _shown(type_: str, data: Any) -> str:
    return storable_text(f"{type_} {json.dumps(data, sort_keys=True, default=repr)}", max_chars=200)


def _replayed_type(event: StoredEvent, declared: frozenset[str]) -> bool:
    """Whether a later attempt's agent emits `event` again, in order: its emissions (not
    `usage.reported`, what the earlier attempt used, not this one) and its completed steps — not
    the platform's record, its seals of interrupted tool calls, nor its retries."""
    if event.type == EventType.TOOL_FINISHED and event.data.get("status") == ToolStatus.INTERRUPTED:
        return False
    emitted = (AGENT_TYPES - {EventType.USAGE_REPORTED}) | declared | {EventType.STEP_COMPLETED}
    return event.type in emitted


def _question(event: StoredEvent) -> bool:
    return event.type == EventType.RUN_WAITING and event.data.get("reason") == WaitReason.INPUT_REQUIRED


def _stored_data(event: StoredEvent) -> dict[str, Any]:
    return {key: value for key, value in event.data.items() if key != FORKED_FROM_SEQ}


class Replay:
    """What a later attempt's agent emits again, matched against the stored log in order and not
    stored again: strictly up to the run's last completed step (a difference fails the run), then
    for as long as it repeats what is stored (the first difference ends the replay: from there on
    the agent is live). A run without a completed step is not replayed."""

    def __init__(self, events: Sequence[StoredEvent], declared: frozenset[str]) -> None:
        durable = any(e.type == EventType.STEP_COMPLETED for e in events)
        self._expected = [e for e in events if _replayed_type(e, declared)] if durable else []
        self._strict = max(
            (i + 1 for i, e in enumerate(self._expected) if e.type == EventType.STEP_COMPLETED), default=0
        )
        stored = events if durable else []
        self._children = [e.data.get("run_id") for e in stored if e.type == EventType.CHILD_SPAWNED]
        # Questions answered: an agent may ask again (and go on) or skip what it asked, as the
        # answer in `ctx.events` tells it; both replay the same.
        self._questions = [_stored_data(e) for e in stored if _question(e)]
        self._position = 0

    @property
    def active(self) -> bool:
        return self._position < len(self._expected)

    def _diverged(self, what: str) -> str | None:
        """The failure, up to the last completed step; past it, the end of the replay (None)."""
        if self._position >= self._strict:
            self._position = len(self._expected)
            return None
        stored = self._expected[self._position]
        return (
            f"non-determinism: replaying its stored log, the agent {what} where seq {stored.seq} holds "
            f"{_shown(stored.type, _stored_data(stored))} (docs/design/execution.md#determinism)"
        )

    def emitted(self, type_: str, data: dict[str, Any]) -> tuple[bool, str | None]:
        """(True, None) when the event is the next one stored: it is not stored again; (False,
        None) when the agent is live again; (False, the failure) for a difference that fails the run."""
        stored = self._expected[self._position]
        if stored.type != type_ or _stored_data(stored) != _json(data):
            return False, self._diverged(f"emitted {_shown(type_, data)}")
        self._position += 1
        return True, None

    def waited(self, reason: str, prompt: str | None) -> tuple[bool, str | None]:
        """A question asked again: (True, None) when the log holds it, answered; else as `emitted`."""
        asked = {"reason": reason, "prompt": prompt}
        if self._questions and self._questions[0] == _json(asked):
            self._questions.pop(0)
            return True, None
        return False, self._diverged(f"asked {_shown(EventType.RUN_WAITING, asked)}")

    def step(self, name: str, ordinal: int) -> tuple[bool, Any, str | None]:
        """(True, its stored result, None) for the step the log holds next; else as `emitted`."""
        stored = self._expected[self._position]
        if stored.type != EventType.STEP_COMPLETED:
            return False, None, self._diverged(f"took step {name!r} (#{ordinal})")
        if stored.data.get("name") != name or stored.data.get("ordinal") != ordinal:
            shown = f"step {stored.data.get('name')!r} (#{stored.data.get('ordinal')})"
            return (
                False,
                None,
                (
                    f"non-determinism: replaying its stored log, the agent took step {name!r} (#{ordinal}) where "
                    f"seq {stored.seq} holds {storable_text(shown, max_chars=200)}: a step out of order "
                    "(docs/design/execution.md#determinism)"
                ),
            )
        self._position += 1
        return True, stored.data.get("result"), None

    def ended(self, what: str) -> str | None:
        """The agent ended: the failure before its last completed step, else None."""
        return self._diverged(what)

    def child(self) -> UUID | None:
        """The next child the stored log holds, while replaying."""
        while self._children and self.active:
            run_id = self._children.pop(0)
            if isinstance(run_id, str):
                return UUID(run_id)
        return None


class DurableSteps:
    """The durable steps of one attempt: what `ctx.step` does."""

    def __init__(
        self,
        *,
        run_id: UUID,
        writer: EventWriter,
        steps: Steps,
        replay: Replay,
        hooks: StepHooks,
    ) -> None:
        self._run_id = run_id
        self._writer = writer
        self._steps = steps
        self._token = writer.lease.token
        self.replay = replay
        self._hooks = hooks
        self._ordinal = 0
        self._running = False
        # The idempotency key of the step being called (`ctx.step_key`), None between steps.
        self.key: str | None = None

    async def step(
        self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], retry: Retry
    ) -> Any:
        _checked_name(name)
        if not isinstance(retry, Retry):
            raise TypeError(f"retry must be a runs.agents.Retry, not {type(retry).__name__}")
        if self._running:
            # A second step started while one runs would take its place in the log by chance.
            raise RuntimeError(f"step {name!r} started while another step runs: await each step before the next")
        self._running = True
        try:
            self._ordinal += 1
            if self.replay.active:
                replayed, result, problem = self.replay.step(name, self._ordinal)
                if problem is not None:
                    await self._fail(FailCode.AGENT_ERROR, problem)
                if replayed:
                    return result
            return await self._call(name, self._ordinal, fn, args, kwargs, retry)
        finally:
            self._running = False

    async def _call(
        self,
        name: str,
        ordinal: int,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        retry: Retry,
    ) -> Any:
        call = 1
        while True:
            await self._count()
            self.key = f"{self._run_id}:{ordinal}"
            try:
                await self._hooks.before_call(name, ordinal, call)
                if inspect.iscoroutinefunction(fn):
                    result = await fn(*args, **kwargs)
                else:
                    result = await self._steps.to_thread(fn, *args, **kwargs)
            except Cancelled:
                raise
            except Exception as exc:
                if not retry.retries(exc, call=call):
                    if isinstance(exc, retry.retry_on):
                        raise StepFailed(name, ordinal, call, exc) from exc
                    raise
                await self._retry(name, ordinal, exc, call=call, retry=retry)
                call += 1
                continue
            finally:
                self.key = None
            return await self._complete(name, ordinal, result)

    async def retry_wait(self, name: str, error: BaseException, *, call: int, retry: Retry) -> float:
        """A retry the agent drives itself (`ctx.retry_wait`): counted, recorded and waited for as a
        step's, with no ordinal (it is no step of the log's)."""
        _checked_name(name)
        await self._count()
        return await self._retry(name, None, error, call=call, retry=retry)

    async def _retry(self, name: str, ordinal: int | None, error: BaseException, *, call: int, retry: Retry) -> float:
        wait = retry.wait(error, call=call, draw=self._hooks.draw())
        retrying = {
            "name": name,
            "ordinal": ordinal,
            "call": call,
            "error": type(error).__name__,
            "message": storable_text(str(error), max_chars=2_000),
            "wait": wait,
        }
        await self._record(EventType.STEP_RETRYING, retrying)
        await self._hooks.sleep(wait, self._token)
        return wait

    async def _complete(self, name: str, ordinal: int, result: Any) -> Any:
        problem = value_problem(result, max_bytes=conf.MAX_BODY_BYTES)
        if problem is not None:
            await self._fail(
                FailCode.INVALID_OUTPUT, f"step {name!r} (#{ordinal}): its result cannot be stored: {problem}"
            )
        stored = _json(result)
        await self._record(EventType.STEP_COMPLETED, {"name": name, "ordinal": ordinal, "result": stored})
        await self._hooks.after_completed(name, ordinal)
        return stored

    async def _count(self) -> None:
        """One more step toward `max_steps`: a call past the budget never starts."""
        await self._writer.step()
        if self._token.tripped:
            raise Cancelled(self._token.reason)

    async def _record(self, type_: str, data: dict[str, Any]) -> None:
        """Store an event of the step's and wait until it has committed."""
        await self._writer.emit(type_, data)
        await self._writer.drain()
        if self._token.tripped:
            raise Cancelled(self._token.reason)

    async def _fail(self, code: FailCode, reason: str) -> None:
        """The run fails with `reason`, after what the agent emitted before."""
        await self._writer.drain()
        self._writer.fail(code, reason)
        raise Cancelled(reason)
