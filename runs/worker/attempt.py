"""One attempt of one run, executed by a worker: the agent driver (docs/design/execution.md#driver).

The agent runs in its own task, raced against the attempt's token; its lease and heartbeat are
`runs.worker.lease`, its writes `runs.worker.writer`, the steps it starts `runs.worker.steps`.
"""

import asyncio
import enum
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any
from uuid import UUID

from django.utils import timezone

from runs import agents, logs, selectors, services
from runs.events import EventType, RequeueCause, WaitReason
from runs.exceptions import StaleAttempt
from runs.models import AttemptOutcome, Run, RunAttempt
from runs.storable import storable_text
from runs.transitions import FailCode
from runs.worker import checks
from runs.worker.context import AttemptContext
from runs.worker.db import TRANSIENT_DB_ERRORS, Db
from runs.worker.durable import DurableSteps, Replay, StepHooks
from runs.worker.lease import AttemptConfig, Lease
from runs.worker.steps import Steps
from runs.worker.writer import EventWriter, write_failure

log = logging.getLogger(__name__)

# Agent tasks the worker stopped awaiting; kept referenced so they are not garbage-collected mid-run.
_ABANDONED: set[asyncio.Future[Any]] = set()


class End(enum.Enum):
    # The attempt's last write (complete, fail, wait, requeue) committed; it released the attempt.
    COMMITTED = "committed"
    # The run left this attempt's hands (or the attempt was told to stop); the worker releases it.
    STOPPED = "stopped"


async def _next_directive(generator: AsyncIterator[agents.Directive]) -> agents.Directive:
    try:
        return await anext(generator)
    except StopAsyncIteration:
        return agents.Complete(None)  # an agent that just ends completes with no output


def _stored_events(run_id: UUID) -> list[agents.StoredEvent]:
    return [
        agents.StoredEvent(seq=e.seq, type=e.type, data=e.data, attempt=e.attempt)
        for e in selectors.run_events_all(run_id=run_id)
    ]


class Execution:
    def __init__(
        self,
        *,
        run: Run,
        attempt: RunAttempt,
        db: Db,
        config: AttemptConfig,
        claimed_at: float,
        hooks: StepHooks | None = None,
    ) -> None:
        self.run_id: UUID = run.pk
        self.generation: int = attempt.generation
        self.agent_name = run.agent
        self.input: dict[str, Any] = run.input if isinstance(run.input, dict) else {}
        self.is_child = run.parent_id is not None
        self.token = agents.CancellationToken()
        self.lease = Lease(
            run_id=self.run_id,
            generation=self.generation,
            db=db,
            config=config,
            token=self.token,
            stop=self.stop,
            # Loop time before the claim was sent: the lease certainly runs no longer than from then.
            renewed_at=claimed_at,
            label=repr(self),
        )
        self.writer = EventWriter(self.lease, run)
        # What the agent started through its context that an await alone cannot stop; it keeps
        # the unwind's one deadline too.
        self.steps = Steps(
            label=repr(self), token=self.token, grace_seconds=config.cancel_grace_seconds, writer=self.writer
        )
        # The agent's durable steps; their replay is the stored log's, read when the agent starts.
        self.durable = DurableSteps(
            run_id=self.run_id,
            writer=self.writer,
            steps=self.steps,
            replay=Replay((), frozenset()),
            hooks=hooks or StepHooks(),
        )
        # True when the driver failed: the worker stopped the attempt on its own account.
        self._driver_failed = False
        # Requests from the worker, honoured at the next safe boundary (forced: at once).
        self._pause_requested = self._shutdown_requested = self._shutdown_forced = False
        # The service of the attempt's last write, for the log.
        self._last_write = ""
        # How many events the agent emitted in this attempt: a refused one is named by its index.
        self._emitted = 0
        # What the agent used and could not emit, the run having ended under it: its release adds it.
        self.usage_at_stop: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"<attempt {self.generation} of run {self.run_id}>"

    @property
    def gave_up(self) -> bool:
        """True when the worker stopped the attempt on its own account (its lease lapsed, the
        driver failed) rather than because the run left its hands."""
        return self._driver_failed or self.lease.lost

    # --- signals from the worker ---------------------------------------------------------------

    def stop(self, reason: str, *, via: str) -> None:
        """Trip the token: the agent stops at its next await and the attempt is released."""
        if not self.token.tripped:
            log.info("%s: stopping: %s (learnt by %s)", self, reason, via, extra={"event": "stopping"})
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
        logs.bind_attempt(self.run_id, self.generation)  # this task's log lines name the attempt
        try:
            return await self._run()
        except asyncio.CancelledError:
            # The worker is exiting without waiting for the attempt: nothing it started may outlive it.
            self.steps.kill()
            raise

    async def _run(self) -> End:
        heartbeat = asyncio.create_task(self.lease.keep(), name=f"heartbeat {self}")
        try:
            end = await self._drive()
            if end is End.STOPPED and self.writer.failure is not None and not self.lease.lost:
                # The attempt stopped on its own failure (a write refused, the agent's data
                # invalid): the run fails with it, here and now — not a lost worker, later.
                end = await self._end_failed()
        except StaleAttempt as exc:
            # Before the agent started: the run moved on, or the lease lapsed meanwhile.
            self.stop(exc.message, via="fence")
            end = End.STOPPED
        except Exception:
            # A bug in the driver, or the database gone for good: stop executing and let the lease
            # (and the sweeper) decide what becomes of the run.
            log.exception("%s: the driver failed", self)
            self._driver_failed = True
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
        why = self.token.reason if end is End.STOPPED else self._last_write
        log.info("%s: released (%s)", self, why, extra={"event": "released"})
        return end

    async def _drive(self) -> End:
        events = await self.writer.commit(_stored_events, self.run_id)
        try:
            agent = agents.get_agent(self.agent_name)
        except KeyError:
            return await self._fail(FailCode.AGENT_ERROR, f"unknown agent {self.agent_name!r}")
        self.durable.replay = Replay(events, agents.declared_types(self.agent_name))
        generator = agent(AttemptContext(self, events))
        tripped = asyncio.ensure_future(self.token.wait())
        tripped.add_done_callback(self._on_trip)
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
                    return await self._fail(FailCode.AGENT_ERROR, *checks.raised(directive))
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

    def _directive(self, step: asyncio.Future[agents.Directive]) -> agents.Directive | Exception | End:
        if step.cancelled():
            return RuntimeError("the agent's task was cancelled")
        error = step.exception()
        if error is None:
            return step.result()
        if isinstance(error, agents.Cancelled) and self.token.tripped:
            return End.STOPPED
        if isinstance(error, Exception):
            return error
        raise error

    async def _apply(self, directive: agents.Directive) -> End | None:
        if isinstance(directive, agents.Emit):
            index, self._emitted = self._emitted, self._emitted + 1
            problem = checks.emit_problem(index, directive, agents.declared_types(self.agent_name))
            if problem is not None:
                return await self._fail(FailCode.INVALID_OUTPUT, problem)
            if self.durable.replay.active:
                return await self._replayed(directive.type, checks.event_data(directive))
            await self.writer.emit(directive.type, checks.event_data(directive))
            return None
        if isinstance(directive, agents.Step):
            if not self.durable.replay.active:  # a step replayed was counted when it was first taken
                await self.writer.step()
            return None
        if not isinstance(directive, agents.Wait | agents.Complete | agents.Fail):
            what = storable_text(repr(directive), max_chars=200)
            return await self._fail(FailCode.INVALID_OUTPUT, f"the agent yielded {what}, not a directive")
        problem = checks.ending_problem(directive)
        if problem is not None:
            return await self._fail(FailCode.INVALID_OUTPUT, problem)
        if self.durable.replay.active:
            if isinstance(directive, agents.Wait) and directive.reason == WaitReason.INPUT_REQUIRED:
                # Asked by an earlier attempt: its answer is stored, the agent goes on.
                replayed, problem = self.durable.replay.waited(directive.reason, directive.prompt)
            else:
                replayed, problem = False, self.durable.replay.ended(f"ended ({type(directive).__name__.lower()})")
            if problem is not None:
                return await self._fail(FailCode.AGENT_ERROR, problem)
            if replayed:
                return None
        fence = {"run_id": self.run_id, "generation": self.generation}
        if isinstance(directive, agents.Wait):
            return await self._finish(services.run_wait, **fence, reason=directive.reason, prompt=directive.prompt)
        if isinstance(directive, agents.Complete):
            return await self._finish(services.run_complete, **fence, output=directive.output)
        return await self._fail(FailCode.AGENT_ERROR, directive.reason, directive.error)

    async def _replayed(self, type_: str, data: dict[str, Any]) -> End | None:
        """An event emitted while the stored log is replayed: matched, not stored again (or, past the
        last completed step, the first new one, stored); what an earlier attempt used is not
        reported twice."""
        if type_ == EventType.USAGE_REPORTED:
            return None
        replayed, problem = self.durable.replay.emitted(type_, data)
        if problem is not None:
            return await self._fail(FailCode.AGENT_ERROR, problem)
        if not replayed:  # past the last completed step, the agent does something new: stored
            await self.writer.emit(type_, data)
        return None

    async def _park(self) -> End:
        if self._shutdown_requested:
            return End.COMMITTED if await self._requeue() else End.STOPPED
        return await self._finish(
            services.run_wait, run_id=self.run_id, generation=self.generation, reason=WaitReason.PAUSED
        )

    async def _requeue(self) -> bool:
        """Hand the run back to the queue on a clean shutdown (not counted as a lost attempt)."""
        if not self._shutdown_forced:
            await self.writer.drain()
        await self.steps.close()  # the requeue releases the attempt
        try:
            await self.writer.commit(
                services.run_requeue,
                run_id=self.run_id,
                generation=self.generation,
                cause=RequeueCause.WORKER_SHUTDOWN,
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
        """The attempt's last write, once everything the agent emitted is stored: never over an
        event that could not be (the token has tripped then)."""
        await self.writer.drain()
        if self.token.tripped:
            return End.STOPPED
        return await self._end(service, **kwargs)

    async def _end_failed(self) -> End:
        assert self.writer.failure is not None
        code, reason = self.writer.failure
        return await self._end(
            services.run_fail, run_id=self.run_id, generation=self.generation, code=code, reason=reason
        )

    async def _end(self, service: Callable[..., Run], **kwargs: Any) -> End:
        """Commit the attempt's end, with its release, or find the run gone. An end the database
        refuses is this attempt's failure, and the run fails with it instead."""
        # It commits the release too: whatever the agent left running stops first.
        await self.steps.close()
        try:
            await self.writer.commit(service, persist=self.writer.failure is not None, **kwargs)
        except StaleAttempt as exc:
            self.stop(exc.message, via="fence")
            return End.STOPPED
        except TRANSIENT_DB_ERRORS:  # `commit` gives up on these only once the token tripped
            return End.STOPPED
        except Exception as exc:
            if self.writer.failure is not None:
                raise  # the failure's own end, which holds no data of the agent's, failed too
            log.exception("%s: its end could not be stored", self)
            self.writer.fail(*write_failure(exc, f"the run's end ({service.__name__})"))
            return await self._end_failed()
        self._last_write = service.__name__
        return End.COMMITTED

    def _on_trip(self, tripped: asyncio.Future[None]) -> None:
        # At the trip itself, not once the agent has unwound: a process gets the whole grace to exit.
        if not tripped.cancelled():
            self.steps.interrupt()

    async def _unwind(self, step: asyncio.Future[agents.Directive]) -> bool:
        """Cancel the agent's task and give it until the deadline; False if it ignored us and is
        abandoned. Either way, what it started is stopped."""
        if not step.done():
            step.cancel()
            await asyncio.wait({step}, timeout=self.steps.time_left())
        ended = step.done()
        if ended:
            if not step.cancelled():
                step.exception()  # retrieved, so asyncio does not report it as unhandled
        else:
            log.warning("%s: the agent ignored cancellation; abandoning it", self)
            _ABANDONED.add(step)
            step.add_done_callback(self._late)
        await self.steps.close()
        return ended

    def _late(self, step: asyncio.Future[Any]) -> None:
        _ABANDONED.discard(step)
        outcome = "was cancelled" if step.cancelled() else "raised" if step.exception() else "returned"
        log.warning("%s: an abandoned agent task finished late (it %s); its result was discarded", self, outcome)

    async def _close(self, generator: AsyncIterator[agents.Directive]) -> None:
        aclose = getattr(generator, "aclose", None)
        if aclose is None:
            return
        # When stopping, within the unwind's second grace (`Steps.time_left`).
        timeout = self.steps.time_left(hard=True) if self.token.tripped else self.lease.config.cancel_grace_seconds
        try:
            await asyncio.wait_for(aclose(), timeout=timeout)
        except Exception:
            log.debug("%s: closing the agent raised", self, exc_info=True)

    # --- release -------------------------------------------------------------------------------

    async def _release(self, outcome: AttemptOutcome | None) -> None:
        """Record when the attempt stopped executing. The database may be unreachable just now
        (that may be why the attempt stopped): the time is taken now and the record retried until
        it lands, so `released_at` says when the work stopped, not when the database came back."""
        await self.steps.close()
        released_at = timezone.now()
        delay = 0.1
        while True:
            try:
                await self.lease.db.control.call(
                    services.run_attempt_release,
                    run_id=self.run_id,
                    generation=self.generation,
                    outcome=outcome,
                    released_at=released_at,
                    usage=self.usage_at_stop,
                )
                return
            except TRANSIENT_DB_ERRORS as exc:
                log.warning("%s: could not record its release yet (%s); retrying", self, exc)
            except Exception:
                log.exception("%s: could not record its release", self)
                return
            await asyncio.sleep(delay)
            delay = min(2 * delay, 2.0)
