"""An attempt's writer (docs/design/execution.md#leases): what the agent emits, stored in its order, in
as few transactions as the database's pace allows, and only while the attempt holds its lease.
Retries after an ambiguous failure are safe (appends carry what the attempt last saw); any other
failure is the attempt's, and the run fails with it (docs/design/execution.md#writer).
"""

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from django.db import DataError

from runs import services
from runs.exceptions import StaleAttempt, ValidationFailed
from runs.models import Run
from runs.storable import storable_text
from runs.transitions import FailCode
from runs.worker.db import TRANSIENT_DB_ERRORS
from runs.worker.lease import Lease, sleep_unless_tripped

log = logging.getLogger(__name__)

T = TypeVar("T")


class _StepMark:
    def __repr__(self) -> str:
        return "STEP"


STEP = _StepMark()

Pending = tuple[str, dict[str, Any]] | _StepMark


def _leading_steps(pending: Sequence[Pending]) -> int:
    n = 0
    while n < len(pending) and pending[n] is STEP:
        n += 1
    return n


def _leading_events(pending: Sequence[Pending], limit: int) -> list[tuple[str, dict[str, Any]]]:
    batch: list[tuple[str, dict[str, Any]]] = []
    for item in pending[:limit]:
        if isinstance(item, _StepMark):
            break
        batch.append(item)
    return batch


def write_failure(error: Exception, what: str) -> tuple[FailCode, str]:
    """How a run fails when the write of `what` failed with `error` (neither the fence nor a
    transient error): the data refused — by the database (SQLSTATE class 22) or by a service's own
    check — is the agent's output being invalid; anything else the platform's storage failing."""
    refused = isinstance(error, DataError | ValidationFailed)
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    reason = storable_text(f"{what} could not be stored: {type(error).__name__}: {message}", max_chars=2_000)
    return (FailCode.INVALID_OUTPUT if refused else FailCode.STORAGE_ERROR), reason


class EventWriter:
    """The writes of one attempt, made under its lease. A write that finds the attempt stale (or
    exhausts a budget) stops the attempt; one that fails otherwise is the attempt's `failure`
    (the code and reason its run fails with) and stops it too."""

    def __init__(self, lease: Lease, run: Run) -> None:
        self.lease = lease
        # What this attempt last saw of the run: only it writes events and steps while it holds
        # the run, so these tell a retried write that already committed (see the services).
        self.last_seq: int = run.last_seq
        self.steps_used: int = run.steps_used
        # Held for each write, so a child's spawn keeps its place among the events.
        self._writes = asyncio.Lock()
        self.failure: tuple[FailCode, str] | None = None
        # After a batch failed: one event per write, to store what precedes the refused event.
        self._one_by_one = False
        # With a step budget every step is counted before the agent goes on, so a step past the
        # budget never starts.
        self._step_budget = run.max_steps is not None
        # What the agent emitted and has not been stored yet, in its order: events, and `STEP`
        # for each step to count. The order matters to budgets: a step past `max_steps` stops the
        # run after exactly the events emitted before it.
        self._pending: list[Pending] = []
        self._flusher: asyncio.Task[None] | None = None

    async def emit(self, type_: str, data: dict[str, Any]) -> None:
        self._pending.append((type_, data))
        self._kick()
        # Backpressure: an agent far ahead of the database waits for its events to be stored.
        if len(self._pending) >= 4 * self.lease.config.batch_max:
            await self.drain()

    async def step(self) -> None:
        self._pending.append(STEP)
        self._kick()
        if self._step_budget:
            await self.drain()

    async def spawn_child(self, input: dict[str, Any], *, metadata: dict[str, str] | None = None) -> Run:
        """Raises `StaleAttempt` when the run left the attempt; a failed spawn is the attempt's
        failure (`fail`), raised as `StaleAttempt` too: either way the attempt is over."""
        # The parent's events stay in the order the agent produced them.
        await self.drain()
        async with self._writes:
            if self.failure is not None:
                raise StaleAttempt(self.failure[1])
            try:
                child = await self.commit(
                    services.run_child_spawn,
                    run_id=self.lease.run_id,
                    generation=self.lease.generation,
                    input=input,
                    metadata=metadata,
                    after_seq=self.last_seq,
                )
            except (StaleAttempt, *TRANSIENT_DB_ERRORS):
                raise
            except Exception as exc:
                code, reason = write_failure(exc, "a child run")
                self.fail(code, reason)
                raise StaleAttempt(reason) from exc
            self.last_seq += 1
        return child

    def fail(self, code: FailCode, reason: str) -> None:
        """The attempt cannot go on: its run fails with `code` and `reason` (the first failure
        wins), and the attempt stops."""
        if self.failure is None:
            self.failure = (code, reason)
        self.lease.stop(reason, via="write")

    async def commit(self, fn: Callable[..., T], /, *args: Any, persist: bool = False, **kwargs: Any) -> T:
        """Run a database call on the work lane, retrying while the database is unreachable and the
        attempt still holds its lease; once the lease may have lapsed, nothing more is written.
        Once the token has tripped it stops retrying, unless told to `persist` (the run's end
        after the attempt's own failure, the one write left to make)."""
        while True:
            if self.lease.lapsed():
                self.lease.lose("before a write")
                raise StaleAttempt(f"{self.lease.label} no longer holds a lease; it writes nothing more")
            try:
                return await self.lease.db.work.call(fn, *args, **kwargs)
            except TRANSIENT_DB_ERRORS as exc:
                if self.lease.token.tripped and not persist:
                    raise
                log.warning("%s: database unavailable (%s); retrying", self.lease.label, exc)
                pause = min(0.5, self.lease.config.heartbeat_seconds)
                await (asyncio.sleep(pause) if persist else sleep_unless_tripped(self.lease.token, pause))

    async def drain(self) -> None:
        """Wait until everything emitted so far is stored, or the token trips: a write hanging on
        an unreachable database must not keep a stopped attempt from stopping (whatever it
        carries is fenced, or lands before anyone else may hold the run)."""
        while self._flusher is not None and not self._flusher.done() and not self.lease.token.tripped:
            tripped = asyncio.ensure_future(self.lease.token.wait())
            try:
                await asyncio.wait({self._flusher, tripped}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                tripped.cancel()

    async def _write_next(self) -> None:
        """Store what leads the pending list: the steps counted before the next event, or the
        next batch of events."""
        fence = {"run_id": self.lease.run_id, "generation": self.lease.generation}
        steps = _leading_steps(self._pending)
        if steps:
            record = {"steps": steps, "after_steps": self.steps_used}
            if await self._stored("the agent's steps", services.run_steps_record, **fence, **record):
                self.steps_used += steps
                del self._pending[:steps]
            return
        batch = _leading_events(self._pending, 1 if self._one_by_one else self.lease.config.batch_max)
        first = self.last_seq + 1
        last = first + len(batch) - 1
        what = (
            f"the event at seq {first} ({batch[0][0]})" if len(batch) == 1 else f"the events at seq {first} to {last}"
        )
        append = {"events": batch, "after_seq": self.last_seq}
        if await self._stored(what, services.run_events_append, **fence, **append):
            self.last_seq += len(batch)
            del self._pending[: len(batch)]

    async def _stored(self, what: str, fn: Callable[..., Any], /, **kwargs: Any) -> bool:
        """Commit one write; False when it failed for good. A batch of events that failed is
        written again one event at a time, so that what precedes the refused event is stored."""
        try:
            await self.commit(fn, **kwargs)
        except (StaleAttempt, *TRANSIENT_DB_ERRORS):
            raise
        except Exception as exc:
            log.warning("%s: %s failed: %s", self.lease.label, what, exc)
            if len(kwargs.get("events", ())) > 1:
                self._one_by_one = True
            else:
                self.fail(*write_failure(exc, what))
            return False
        return True

    def _kick(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name=f"flush {self.lease.label}")

    async def _flush(self) -> None:
        # Group commit: whatever the agent emitted while the previous append was in flight goes
        # into the next transaction — one transaction per event when the agent is slow, many
        # events per transaction when it is fast. Each event still gets its own seq.
        while self._pending and not self.lease.token.tripped:
            try:
                async with self._writes:
                    await self._write_next()
            except StaleAttempt as exc:
                # Includes a budget this write exhausted: the run is stopped, the attempt must end.
                self.lease.stop(exc.message, via="fence")
            except TRANSIENT_DB_ERRORS:
                return  # `commit` gives up on these only once the token tripped: the attempt is ending
            except Exception as exc:
                # Whatever else went wrong, the agent's output is not all stored: the run must not end
                # as if it were.
                log.exception("%s: the writer failed", self.lease.label)
                self.fail(*write_failure(exc, "the agent's output"))
