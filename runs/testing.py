"""Testing agents (docs/how-to/test-agents.md): a run executed in this process against the real
database, attempt after attempt as workers would, with a fake clock for the waits of retries and
failures injected into durable steps — the attempt killed after step N, step M raising K times —
so that an agent's author can prove it resumes exactly (docs/design/execution.md#determinism)."""

import asyncio
import random
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from uuid import UUID

from runs import services
from runs.agents.base import CancellationToken, Cancelled
from runs.conf import conf
from runs.models import Run
from runs.selectors.clock import db_now
from runs.transitions import Status
from runs.worker.attempt import Execution
from runs.worker.db import Db
from runs.worker.durable import StepHooks

__all__ = ["FakeClock", "Trial", "execute"]


class _Killed(BaseException):
    """The attempt dies where it stands, as a worker killed with SIGKILL: nothing more is written.
    A BaseException, so the agent's own `except Exception` does not stop it."""


class FakeClock:
    """The waits of step retries, taken at once: `now` moves on by each, `waits` lists them. Its
    jitter is drawn from a seeded generator, so a test sees the same waits every time."""

    def __init__(self, *, seed: int = 0) -> None:
        self.now = 0.0
        self.waits: list[float] = []
        self._random = random.Random(seed)

    def draw(self) -> float:
        return self._random.random()


@dataclass
class Trial:
    """What `execute` did: the run as it was left, the attempts it took and where it killed them."""

    run: Run
    attempts: int
    # The step ordinals after which an attempt was killed.
    kills: list[int] = field(default_factory=list)
    # How many times each step ordinal was made to raise.
    raised: dict[int, int] = field(default_factory=dict)


class _Hooks(StepHooks):
    def __init__(
        self, clock: FakeClock, kill_after: Collection[int], raises: Mapping[int, tuple[int, Callable[[], Exception]]]
    ) -> None:
        self.clock = clock
        self.kill_after = set(kill_after)
        self.raises = raises
        self.kills: list[int] = []
        self.raised: dict[int, int] = {}

    def draw(self) -> float:
        return self.clock.draw()

    async def sleep(self, seconds: float, token: CancellationToken) -> None:
        self.clock.waits.append(seconds)
        self.clock.now += seconds
        if token.tripped:
            raise Cancelled(token.reason)
        await asyncio.sleep(0)

    async def before_call(self, name: str, ordinal: int, call: int) -> None:
        if ordinal in self.raises:
            times, error = self.raises[ordinal]
            if self.raised.get(ordinal, 0) < times:
                self.raised[ordinal] = self.raised.get(ordinal, 0) + 1
                raise error()

    async def after_completed(self, name: str, ordinal: int) -> None:
        if ordinal in self.kill_after:
            self.kill_after.discard(ordinal)  # each kill once: the next attempt goes past it
            self.kills.append(ordinal)
            raise _Killed(f"killed after step {ordinal} ({name!r})")


def execute(
    run: Run | UUID | str,
    *,
    kill_after_steps: Collection[int] = (),
    raises: Mapping[int, tuple[int, Callable[[], Exception]]] | None = None,
    clock: FakeClock | None = None,
    max_attempts: int = 20,
) -> Trial:
    """Execute the queued `run` until it leaves the queue for good (it ended, or it waits), each
    attempt as a worker's, in this process; the run must be the only one queued.

    `kill_after_steps`: the ordinals (1 for the run's first `ctx.step`) after whose `step.completed`
    the attempt dies without another write, as a worker killed with SIGKILL; its lease is then
    taken as lapsed and the run requeued (a lost attempt, counted against the run's
    `max_attempts`). `raises`: {ordinal: (K, make_error)} — the first K calls of that step raise
    `make_error()` instead of calling it, across attempts. `clock` takes the waits of retries.

    The database must see what the test wrote: under pytest-django, `django_db(transaction=True)`."""
    run_id = run.pk if isinstance(run, Run) else UUID(str(run))
    hooks = _Hooks(clock or FakeClock(), kill_after_steps, raises or {})
    attempts = 0
    db = Db(work_threads=1)
    try:
        while Run.objects.get(pk=run_id).status == Status.QUEUED:
            if attempts >= max_attempts:
                raise RuntimeError(f"run {run_id} was still queued after {attempts} attempts")
            attempts += 1
            asyncio.run(_attempt(run_id, db, hooks))
    finally:
        db.stop()
    return Trial(run=Run.objects.get(pk=run_id), attempts=attempts, kills=hooks.kills, raised=hooks.raised)


async def _attempt(run_id: UUID, db: Db, hooks: _Hooks) -> None:
    others = await db.work.call(lambda: Run.objects.filter(status=Status.QUEUED).exclude(pk=run_id).exists())
    if others:
        raise RuntimeError(f"runs.testing executes run {run_id} alone: another run is queued")
    claimed_at = asyncio.get_running_loop().time()
    claimed = await db.work.call(services.run_claim, worker="runs.testing")
    if claimed is None or claimed[0].pk != run_id:
        raise RuntimeError(f"run {run_id} could not be claimed (its start_after may be ahead)")
    run, attempt = claimed
    execution = Execution(
        run=run, attempt=attempt, db=db, config=conf.attempt_config(), claimed_at=claimed_at, hooks=hooks
    )
    try:
        await execution.run()
    except _Killed:
        execution.steps.kill()
        await execution.steps.close()
        # Later, as the sweeper finds it: the lease has lapsed.
        lapsed = await db.work.call(db_now) + timedelta(seconds=2 * conf.LEASE_SECONDS)
        await db.work.call(services.run_lease_expire, run_id=run_id, generation=attempt.generation, as_of=lapsed)
