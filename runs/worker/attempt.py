"""One attempt of one run, executed by a worker: the agent driver, its event writer, its heartbeat.

The agent runs in its own task, one directive at a time, raced against the attempt's token. When
the token trips (the run ended, its lease was lost, the worker shuts down) the driver cancels the
agent's task, gives it `RUNLEDGER_CANCEL_GRACE_SECONDS` to unwind and otherwise abandons it: the
worker stops awaiting it, and whatever it produces later is dropped (and would be refused by the
generation fence anyway). Then the attempt records `released_at`.

Pause and shutdown requests are honoured at the next safe boundary: between two directives, after
everything emitted so far is stored.

Self-fencing: the attempt may execute only while it certainly holds its lease. Its lease is
counted from the moment the last successful renewal (or the claim) was *sent*, on the loop's
monotonic clock; `AttemptConfig.fence_after` seconds later — the lease less the time the agent
gets to unwind and a margin — the attempt stops itself and makes no more writes, whether the
database is unreachable, a renewal hangs, or the process was stalled. So it has stopped, and
recorded when, before any sweeper may requeue the run; its writes are fenced by generation anyway.

Retries after an ambiguous failure (the connection dropped, perhaps after the commit) are safe:
appends and step counts carry what the attempt last saw (`after_seq`, `after_steps`), so the
service recognises a write that already committed instead of storing it twice.
"""

import asyncio
import contextlib
import enum
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from uuid import UUID

from django.db import InterfaceError, OperationalError
from django.utils import timezone

from runs import selectors, services
from runs.agents.base import (
    CancellationToken,
    Cancelled,
    Complete,
    Directive,
    Emit,
    Fail,
    Step,
    StoredEvent,
    Wait,
    get_agent,
)
from runs.exceptions import StaleAttempt, ValidationFailed
from runs.models import AttemptOutcome, Run, RunAttempt
from runs.transitions import FailCode
from runs.worker.db import Db

log = logging.getLogger(__name__)

T = TypeVar("T")

# Errors that say "the database could not be reached just now", worth retrying while the lease holds.
TRANSIENT_DB_ERRORS = (OperationalError, InterfaceError)

# Agent tasks the worker stopped awaiting; kept referenced so they are not garbage-collected mid-run.
_ABANDONED: set[asyncio.Future[Any]] = set()


@dataclass(frozen=True)
class AttemptConfig:
    heartbeat_seconds: float
    lease_seconds: float
    cancel_grace_seconds: float
    batch_max: int

    @property
    def fence_after(self) -> float:
        """Seconds after a renewal was sent that the attempt stops itself if none succeeded since:
        the lease, less up to two cancel graces to unwind the agent (its task, then its generator)
        and a margin for a timer that fires late on a busy loop."""
        margin = min(self.heartbeat_seconds, self.lease_seconds / 4)
        return self.lease_seconds - margin - 2 * self.cancel_grace_seconds


class End(enum.Enum):
    # The attempt's last write (complete, fail, wait, requeue) committed; it released the attempt.
    COMMITTED = "committed"
    # The run left this attempt's hands (or the attempt was told to stop); the worker releases it.
    STOPPED = "stopped"


class _AttemptContext:
    """What the agent sees (`runs.agents.base.AgentContext`)."""

    def __init__(self, execution: "Execution", events: Sequence[StoredEvent]) -> None:
        self._execution = execution
        self.run_id: UUID = execution.run_id
        self.generation: int = execution.generation
        self.input: dict[str, Any] = execution.input
        self.events: Sequence[StoredEvent] = events
        self.token: CancellationToken = execution.token
        self.is_child: bool = execution.is_child

    async def spawn_child(self, input: dict[str, Any]) -> UUID:
        ex = self._execution
        # The parent's events stay in the order the agent produced them.
        await ex.drain()
        try:
            async with ex.writes:
                child = await ex.commit(
                    services.run_child_spawn,
                    run_id=ex.run_id,
                    generation=ex.generation,
                    input=input,
                    after_seq=ex.last_seq,
                )
                ex.last_seq += 1
        except StaleAttempt as exc:
            ex.stop(exc.message, via="spawn")
            raise Cancelled(ex.token.reason) from exc
        except TRANSIENT_DB_ERRORS as exc:  # `commit` gives up on these only once the token tripped
            raise Cancelled(ex.token.reason) from exc
        return child.pk


async def _next_directive(generator: AsyncIterator[Directive]) -> Directive:
    try:
        return await anext(generator)
    except StopAsyncIteration:
        return Complete(None)  # an agent that just ends completes with no output


class _StepMark:
    def __repr__(self) -> str:
        return "STEP"


STEP = _StepMark()


def _leading_steps(pending: Sequence[object]) -> int:
    n = 0
    while n < len(pending) and pending[n] is STEP:
        n += 1
    return n


def _leading_events(
    pending: Sequence[tuple[str, dict[str, Any]] | _StepMark], limit: int
) -> list[tuple[str, dict[str, Any]]]:
    batch: list[tuple[str, dict[str, Any]]] = []
    for item in pending[:limit]:
        if isinstance(item, _StepMark):
            break
        batch.append(item)
    return batch


def _stored_events(run_id: UUID) -> list[StoredEvent]:
    return [
        StoredEvent(seq=e.seq, type=e.type, data=e.data, attempt=e.attempt)
        for e in selectors.run_events_all(run_id=run_id)
    ]


def _invalid_event(directive: Emit) -> str | None:
    if not isinstance(directive.type, str) or not directive.type or directive.type in services.LIFECYCLE_TYPES:
        return f"an agent cannot emit {directive.type!r} events"
    if not isinstance(directive.data, dict):
        return f"{directive.type} event data must be a JSON object"
    try:
        json.dumps(directive.data)
    except (TypeError, ValueError) as exc:
        return f"{directive.type} event data is not JSON: {exc}"
    return None


class Execution:
    def __init__(
        self,
        *,
        run: Run,
        attempt: RunAttempt,
        db: Db,
        config: AttemptConfig,
        claimed_at: float,
    ) -> None:
        self.run_id: UUID = run.pk
        self.generation: int = attempt.generation
        self.agent_name = run.agent
        self.input: dict[str, Any] = run.input if isinstance(run.input, dict) else {}
        self.is_child = run.parent_id is not None
        # What this attempt last saw of the run: only it writes events and steps while it holds
        # the run, so these tell a retried write that already committed (see the services).
        self.last_seq: int = run.last_seq
        self.steps_used: int = run.steps_used
        self.writes = asyncio.Lock()
        # With a step budget every step is counted before the agent goes on, so a step past the
        # budget never starts.
        self._step_budget = run.max_steps is not None
        self.token = CancellationToken()
        # True when the worker stopped the attempt on its own account (its lease lapsed, the
        # driver failed) rather than because the run left its hands.
        self.gave_up = False
        self._db = db
        self._config = config
        # Loop time before the claim was sent: the lease certainly runs no longer than from then.
        self._renewed_at = claimed_at
        self._pause_requested = False
        self._shutdown_requested = False
        self._shutdown_forced = False
        # What the agent emitted and has not been stored yet, in its order: events, and `STEP`
        # for each step to count. The order matters to budgets: a step past `max_steps` stops the
        # run after exactly the events emitted before it.
        self._pending: list[tuple[str, dict[str, Any]] | _StepMark] = []
        self._flusher: asyncio.Task[None] | None = None
        # The service of the attempt's last write, for the log.
        self._last_write = ""

    def __repr__(self) -> str:
        return f"<attempt {self.generation} of run {self.run_id}>"

    # --- signals from the worker ---------------------------------------------------------------

    def stop(self, reason: str, *, via: str) -> None:
        """Trip the token: the agent stops at its next await and the attempt is released."""
        if not self.token.tripped:
            log.info("%s: stopping: %s (learnt by %s)", self, reason, via)
            self.token.trip(reason)

    def request_pause(self) -> None:
        self._pause_requested = True

    def request_shutdown(self, *, force: bool = False) -> None:
        self._shutdown_requested = True
        if force:
            self._shutdown_forced = True
            self.stop("the worker is shutting down", via="signal")

    # --- the attempt -----------------------------------------------------------------------------

    async def run(self) -> End:
        heartbeat = asyncio.create_task(self._heartbeat(), name=f"heartbeat {self}")
        try:
            end = await self._drive()
        except StaleAttempt as exc:
            # Before the agent started: the run moved on, or the lease lapsed meanwhile.
            self.stop(exc.message, via="fence")
            end = End.STOPPED
        except Exception:
            # A bug in the driver, or the database gone for good: stop executing and let the lease
            # (and the sweeper) decide what becomes of the run.
            log.exception("%s: the driver failed", self)
            self.gave_up = True
            self.stop("the worker failed", via="driver")
            end = End.STOPPED
        finally:
            heartbeat.cancel()
        if end is End.STOPPED:
            if self._shutdown_forced and not self.gave_up and await self._requeue():
                return End.COMMITTED
            # An attempt the worker gave up while the run may still be its own is `abandoned`; one
            # that someone else closed (cancel, stop, requeue) keeps the outcome they recorded.
            await self._release(AttemptOutcome.ABANDONED if self.gave_up else None)
        log.info("%s: released (%s)", self, self.token.reason if end is End.STOPPED else self._last_write)
        return end

    async def _drive(self) -> End:
        events = await self.commit(_stored_events, self.run_id)
        try:
            agent = get_agent(self.agent_name)
        except KeyError:
            return await self._fail(FailCode.AGENT_ERROR, f"unknown agent {self.agent_name!r}")
        generator = agent(_AttemptContext(self, events))
        tripped = asyncio.ensure_future(self.token.wait())
        abandoned = False
        try:
            while True:
                step = asyncio.create_task(_next_directive(generator), name=f"agent {self}")
                await asyncio.wait({step, tripped}, return_when=asyncio.FIRST_COMPLETED)
                if self.token.tripped:
                    abandoned = not await self._unwind(step)
                    return End.STOPPED
                directive = self._directive(step)
                if isinstance(directive, End):
                    return directive
                if isinstance(directive, Exception):
                    return await self._fail(
                        FailCode.AGENT_ERROR,
                        f"the agent raised {type(directive).__name__}: {directive}",
                        {"type": type(directive).__name__, "message": str(directive)},
                    )
                end = await self._apply(directive)
                if end is not None:
                    return end
                if self.token.tripped:
                    return End.STOPPED
                # A safe boundary: everything before it is emitted, nothing after it has started.
                if self._shutdown_requested or self._pause_requested:
                    return await self._park()
        finally:
            tripped.cancel()
            if not abandoned:
                await self._close(generator)

    def _directive(self, step: asyncio.Future[Directive]) -> Directive | Exception | End:
        if step.cancelled():
            return RuntimeError("the agent's task was cancelled")
        error = step.exception()
        if error is None:
            return step.result()
        if isinstance(error, Cancelled) and self.token.tripped:
            return End.STOPPED
        if isinstance(error, Exception):
            return error
        raise error

    async def _apply(self, directive: Directive) -> End | None:
        if isinstance(directive, Emit):
            problem = _invalid_event(directive)
            if problem is not None:
                return await self._fail(FailCode.INVALID_OUTPUT, problem)
            self._pending.append((directive.type, directive.data))
            self._kick()
            # Backpressure: an agent far ahead of the database waits for its events to be stored.
            if len(self._pending) >= 4 * self._config.batch_max:
                await self.drain()
            return None
        if isinstance(directive, Step):
            self._pending.append(STEP)
            self._kick()
            if self._step_budget:
                await self.drain()
            return None
        if isinstance(directive, Wait):
            if directive.reason not in ("paused", "input_required"):
                return await self._fail(FailCode.INVALID_OUTPUT, f"unknown wait reason {directive.reason!r}")
            return await self._finish(
                services.run_wait,
                run_id=self.run_id,
                generation=self.generation,
                reason=directive.reason,
                prompt=directive.prompt,
            )
        if isinstance(directive, Complete):
            try:
                json.dumps(directive.output)
            except (TypeError, ValueError) as exc:
                return await self._fail(FailCode.INVALID_OUTPUT, f"the output is not JSON: {exc}")
            return await self._finish(
                services.run_complete, run_id=self.run_id, generation=self.generation, output=directive.output
            )
        if isinstance(directive, Fail):
            return await self._fail(FailCode.AGENT_ERROR, directive.reason, directive.error)
        return await self._fail(FailCode.INVALID_OUTPUT, f"the agent yielded {directive!r}, not a directive")

    async def _park(self) -> End:
        if self._shutdown_requested:
            return End.COMMITTED if await self._requeue() else End.STOPPED
        return await self._finish(services.run_wait, run_id=self.run_id, generation=self.generation, reason="paused")

    async def _requeue(self) -> bool:
        """Hand the run back to the queue on a clean shutdown (not counted as a lost attempt)."""
        if not self._shutdown_forced:
            await self.drain()
        try:
            await self.commit(
                services.run_requeue, run_id=self.run_id, generation=self.generation, cause="worker_shutdown"
            )
        except StaleAttempt:
            return False
        except Exception:
            log.exception("%s: could not requeue on shutdown", self)
            return False
        self._last_write = "run_requeue"
        return True

    async def _fail(self, code: FailCode, reason: str, error: Any = None) -> End:
        return await self._finish(
            services.run_fail, run_id=self.run_id, generation=self.generation, code=code, reason=reason, error=error
        )

    async def _finish(self, service: Callable[..., Run], **kwargs: Any) -> End:
        """The attempt's last write: it commits with the attempt's release, or finds the run gone."""
        await self.drain()
        if self.token.tripped:
            return End.STOPPED
        try:
            await self.commit(service, **kwargs)
        except StaleAttempt as exc:
            self.stop(exc.message, via="fence")
            return End.STOPPED
        except TRANSIENT_DB_ERRORS:  # `commit` gives up on these only once the token tripped
            return End.STOPPED
        self._last_write = service.__name__
        return End.COMMITTED

    async def _unwind(self, step: asyncio.Future[Directive]) -> bool:
        """Cancel the agent's task and give it a moment; False if it ignored us and is abandoned."""
        if not step.done():
            step.cancel()
            await asyncio.wait({step}, timeout=self._config.cancel_grace_seconds)
        if step.done():
            if not step.cancelled():
                step.exception()  # retrieved, so asyncio does not report it as unhandled
            return True
        log.warning("%s: the agent ignored cancellation; abandoning it", self)
        _ABANDONED.add(step)
        step.add_done_callback(self._late)
        return False

    def _late(self, step: asyncio.Future[Any]) -> None:
        _ABANDONED.discard(step)
        outcome = "was cancelled" if step.cancelled() else "raised" if step.exception() else "returned"
        log.warning("%s: an abandoned agent task finished late (it %s); its result was discarded", self, outcome)

    async def _close(self, generator: AsyncIterator[Directive]) -> None:
        aclose = getattr(generator, "aclose", None)
        if aclose is None:
            return
        try:
            await asyncio.wait_for(aclose(), timeout=self._config.cancel_grace_seconds)
        except Exception:
            log.debug("%s: closing the agent raised", self, exc_info=True)

    # --- writes ----------------------------------------------------------------------------------

    async def commit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a database call on the work lane, retrying while the database is unreachable and the
        attempt still holds its lease; once the lease may have lapsed, nothing more is written."""
        while True:
            if self._lease_lapsed():
                self._lose_lease("before a write")
                raise StaleAttempt(f"{self} no longer holds a lease; it writes nothing more")
            try:
                return await self._db.work.call(fn, *args, **kwargs)
            except TRANSIENT_DB_ERRORS as exc:
                if self.token.tripped:
                    raise
                log.warning("%s: database unavailable (%s); retrying", self, exc)
                await self._sleep(min(0.5, self._config.heartbeat_seconds))

    def _kick(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name=f"flush {self}")

    async def _flush(self) -> None:
        # Group commit: whatever the agent emitted while the previous append was in flight goes
        # into the next transaction — one transaction per event when the agent is slow, many
        # events per transaction when it is fast. Each event still gets its own seq.
        while self._pending and not self.token.tripped:
            try:
                async with self.writes:
                    steps = _leading_steps(self._pending)
                    if steps:
                        await self.commit(
                            services.run_steps_record,
                            run_id=self.run_id,
                            generation=self.generation,
                            steps=steps,
                            after_steps=self.steps_used,
                        )
                        self.steps_used += steps
                        del self._pending[:steps]
                    else:
                        batch = _leading_events(self._pending, self._config.batch_max)
                        await self.commit(
                            services.run_events_append,
                            run_id=self.run_id,
                            generation=self.generation,
                            events=batch,
                            after_seq=self.last_seq,
                        )
                        self.last_seq += len(batch)
                        del self._pending[: len(batch)]
            except StaleAttempt as exc:
                # Includes a budget this write exhausted: the run is stopped, the attempt must end.
                self.stop(exc.message, via="fence")
            except TRANSIENT_DB_ERRORS:
                return  # `commit` gives up on these only once the token tripped: the attempt is ending
            except ValidationFailed:
                log.exception("%s: could not store the agent's events", self)
                self.gave_up = True
                self.stop("its events could not be stored", via="append")

    async def drain(self) -> None:
        """Wait until everything emitted so far is stored, or the token trips: a write hanging on
        an unreachable database must not keep a stopped attempt from stopping (whatever it
        carries is fenced, or lands before anyone else may hold the run)."""
        while self._flusher is not None and not self._flusher.done() and not self.token.tripped:
            tripped = asyncio.ensure_future(self.token.wait())
            try:
                await asyncio.wait({self._flusher, tripped}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                tripped.cancel()

    # --- lease -----------------------------------------------------------------------------------

    def _fence_at(self) -> float:
        return self._renewed_at + self._config.fence_after

    def _lease_lapsed(self) -> bool:
        return asyncio.get_running_loop().time() >= self._fence_at()

    def _lose_lease(self, when: str) -> None:
        if not self.token.tripped:
            log.warning("%s: could not renew its lease in time (%s); stopping it", self, when)
        self.gave_up = True
        self.stop("its lease lapsed", via="heartbeat")

    async def _heartbeat(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self._config.heartbeat_seconds
        while not self.token.tripped:
            # Wake at the fence at the latest: a renewal that keeps failing must not let the
            # attempt run past it for want of a check.
            await self._sleep(max(0.0, min(interval, self._fence_at() - loop.time())))
            if self.token.tripped:
                return
            if self._lease_lapsed():
                self._lose_lease("no renewal succeeded")
                return
            sent = loop.time()
            try:
                renewed = await asyncio.wait_for(
                    self._db.control.call(
                        services.run_attempt_heartbeat, run_id=self.run_id, generation=self.generation
                    ),
                    # A renewal answered after the fence counts for nothing: stop waiting then.
                    timeout=max(0.01, self._fence_at() - sent),
                )
            except (TimeoutError, *TRANSIENT_DB_ERRORS) as exc:
                if self._lease_lapsed():
                    self._lose_lease(str(exc) or "the renewal timed out")
                    return
                log.warning("%s: heartbeat failed (%s); retrying", self, exc)
                continue
            if not renewed:
                self.stop("the attempt is no longer the run's", via="heartbeat")
                return
            self._renewed_at = sent

    async def _release(self, outcome: AttemptOutcome | None) -> None:
        """Record when the attempt stopped executing. The database may be unreachable just now
        (that may be why the attempt stopped): the time is taken now and the record retried until
        it lands, so `released_at` says when the work stopped, not when the database came back."""
        released_at = timezone.now()
        delay = 0.1
        while True:
            try:
                await self._db.control.call(
                    services.run_attempt_release,
                    run_id=self.run_id,
                    generation=self.generation,
                    outcome=outcome,
                    released_at=released_at,
                )
                return
            except TRANSIENT_DB_ERRORS as exc:
                log.warning("%s: could not record its release yet (%s); retrying", self, exc)
            except Exception:
                log.exception("%s: could not record its release", self)
                return
            await asyncio.sleep(delay)
            delay = min(2 * delay, 2.0)

    async def _sleep(self, seconds: float) -> None:
        """Sleep, waking early when the token trips."""
        waiter: Awaitable[None] = self.token.wait()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waiter, timeout=seconds)
