"""How a worker executes attempts: the registry keyed by generation, agent outcomes, lost leases.

These run the worker in the test process (`Worker.run` in a thread, or `--once`), on a real
database; the process-level behaviour is in test_worker.py.
"""

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any
from uuid import uuid4

import pytest
from django.contrib.auth.models import User
from django.db import connection
from pytest_django import Settings

from runs import services
from runs.agents import base
from runs.agents.base import AgentContext, CancellationToken, Complete, Directive, Emit
from runs.models import AttemptOutcome, Run, RunAttempt, RunEvent
from runs.worker import Worker
from runs.worker.registry import AttemptRegistry
from tests.factories import assert_log_is_sound, queued_run
from tests.support.waiting import wait_until

# --- the registry (no database) -------------------------------------------------------------------


class Held:
    def __init__(self, run_id: Any, generation: int) -> None:
        self.run_id = run_id
        self.generation = generation
        self.token = CancellationToken()
        self.paused = False

    def request_pause(self) -> None:
        self.paused = True


def test_a_stale_attempt_can_neither_unregister_nor_receive_a_newer_ones_signals() -> None:
    registry: AttemptRegistry[Held] = AttemptRegistry()
    run_id = uuid4()
    old, new = Held(run_id, 1), Held(run_id, 2)
    registry.register(old)
    registry.register(new)
    assert old.token.tripped  # superseded: the old attempt must stop

    assert registry.unregister(run_id, 1) is False  # the old attempt ending late removes nothing
    assert registry.get(run_id) is new
    assert registry.trip(run_id, 1, "cancel decided for attempt 1") is False
    assert registry.request_pause(run_id, 1) is False
    assert not new.token.tripped and not new.paused

    assert registry.request_pause(run_id, 2) and new.paused
    assert registry.trip(run_id, 2, "cancelled") and new.token.reason == "cancelled"
    assert registry.unregister(run_id, 2) and registry.get(run_id) is None


def test_an_older_attempt_cannot_displace_a_newer_one() -> None:
    registry: AttemptRegistry[Held] = AttemptRegistry()
    run_id = uuid4()
    registry.register(Held(run_id, 3))
    with pytest.raises(ValueError):
        registry.register(Held(run_id, 2))


def test_a_token_race_cancels_the_work_when_it_trips() -> None:
    async def scenario() -> tuple[str, bool]:
        token = CancellationToken()
        work_cancelled = False

        async def work() -> str:
            nonlocal work_cancelled
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                work_cancelled = True
                raise
            return "done"

        asyncio.get_running_loop().call_later(0.01, token.trip, "stop")
        try:
            await token.race(work())
        except base.Cancelled as exc:
            return str(exc), work_cancelled
        return "not cancelled", work_cancelled

    assert asyncio.run(scenario()) == ("stop", True)


# --- agent outcomes (in-process worker, --once) -----------------------------------------------------


async def _raises(ctx: AgentContext) -> AsyncIterator[Directive]:
    yield Emit("output.delta", {"text": "about to fail "})
    raise KeyError("missing-thing")


async def _lifecycle(ctx: AgentContext) -> AsyncIterator[Directive]:
    yield Emit("run.completed", {"output": "forged"})


async def _just_ends(ctx: AgentContext) -> AsyncIterator[Directive]:
    yield Emit("output.delta", {"text": "hi"})


async def _not_json(ctx: AgentContext) -> AsyncIterator[Directive]:
    yield Complete({"when": object()})


@pytest.mark.django_db(transaction=True)
@pytest.mark.sqlite
def test_agent_outcomes_become_run_outcomes(alice: User, agent_named: Any) -> None:
    raises = queued_run(alice, agent=agent_named("test-raises", _raises), input={})
    forged = queued_run(alice, agent=agent_named("test-lifecycle", _lifecycle), input={})
    ends = queued_run(alice, agent=agent_named("test-just-ends", _just_ends), input={})
    not_json = queued_run(alice, agent=agent_named("test-not-json", _not_json), input={})

    Worker(once=True).run(install_signals=False)

    raises.refresh_from_db()
    assert (raises.status, raises.end_code) == ("failed", "agent_error")
    assert raises.error == {"type": "KeyError", "message": "'missing-thing'"}
    # What the agent emitted before failing is kept, in order, before the terminal event.
    assert [e.type for e in RunEvent.objects.filter(run=raises).order_by("seq")][-2:] == ["output.delta", "run.failed"]
    forged.refresh_from_db()
    assert (forged.status, forged.end_code) == ("failed", "invalid_output")
    ends.refresh_from_db()
    assert ends.status == "completed" and ends.output is None
    not_json.refresh_from_db()
    assert (not_json.status, not_json.end_code) == ("failed", "invalid_output")
    for run in (raises, forged, ends, not_json):
        assert_log_is_sound(run)
        attempt = RunAttempt.objects.get(run=run)
        assert attempt.released_at is not None and attempt.outcome == run.status


# --- a lost lease while executing -------------------------------------------------------------------


@pytest.fixture
def fast(settings: Settings) -> Settings:
    settings.RUNLEDGER_HEARTBEAT_SECONDS = 0.2
    settings.RUNLEDGER_LEASE_SECONDS = 2
    settings.RUNLEDGER_POLL_SECONDS = 0.3
    settings.RUNLEDGER_SQLITE_POLL_SECONDS = 0.05
    settings.RUNLEDGER_SHUTDOWN_GRACE_SECONDS = 2
    return settings


@pytest.fixture
def worker_thread(fast: Settings) -> Iterator[Worker]:
    # `runworker` runs without a pool, each database thread on a connection of its own; here its
    # threads borrow from this process's pool, which needs room for every one of them beside the
    # test's own, or a thread waits a connect timeout for one and its attempt loses its lease.
    pool = getattr(connection, "pool", None)
    if pool is not None:
        pool.resize(pool.min_size, pool.max_size + 10)
    worker = Worker(worker_id="in-thread", concurrency=2)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(timeout=30)
        if pool is not None:
            pool.resize(pool.min_size, pool.max_size - 10)
        assert not thread.is_alive(), "the worker did not stop"


@pytest.mark.django_db(transaction=True)
@pytest.mark.sqlite
def test_an_attempt_whose_run_was_requeued_stops_and_the_next_attempt_finishes(
    alice: User, worker_thread: Worker
) -> None:
    run = queued_run(alice, input={"deltas": 4, "delay_ms": 0, "tool": "slow", "tool_ms": 60_000})
    wait_until(lambda: RunEvent.objects.filter(run=run, type="tool.started").exists(), what="the tool call")
    # The run changes hands behind the worker's back, as when a sweeper finds its lease expired.
    services.run_requeue(run_id=run.pk, generation=1, cause="lease_expired")

    # Attempt 1 learns it is no longer the run's and lets go; the same worker claims attempt 2,
    # which finishes the tool call from the stored events (and is cancelled, being a minute long).
    first = wait_until(
        lambda: RunAttempt.objects.filter(run=run, generation=1, released_at__isnull=False).first(),
        what="attempt 1's release",
    )
    assert first.outcome == AttemptOutcome.LOST
    wait_until(lambda: RunAttempt.objects.filter(run=run, generation=2).exists(), what="attempt 2")
    services.run_cancel(run_id=run.pk, actor=alice)
    second = wait_until(
        lambda: RunAttempt.objects.filter(run=run, generation=2, released_at__isnull=False).first(),
        what="attempt 2's release",
    )
    assert second.outcome == AttemptOutcome.CANCELLED and second.worker == "in-thread"
    run = Run.objects.get(pk=run.pk)
    assert run.lost_attempts == 1
    assert RunEvent.objects.filter(run=run, type="tool.started").count() == 1
    assert_log_is_sound(run)
