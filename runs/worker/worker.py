"""The worker: claims queued runs and executes them, at most `concurrency` at a time
(docs/design/execution.md#worker-loop).

One asyncio loop per process, woken by a notification OR a poll timeout OR stop; it also sweeps,
kills what lost attempts left on its machine, delivers webhooks and fires schedules.
"""

import asyncio
import logging
import os
import random
import signal
import socket
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import DatabaseError, connection

from runs import logs, notify, services
from runs.conf import conf
from runs.metrics import series
from runs.models import Run
from runs.notify.listener import Listener
from runs.selectors.clock import db_now
from runs.selectors.states import queue_next_start_in, run_worker_states
from runs.transitions import TERMINAL, Status
from runs.worker.attempt import Execution
from runs.worker.db import Db
from runs.worker.orphans import Reaper, machine
from runs.worker.registry import AttemptRegistry
from runs.worker.scheduler import Scheduler
from runs.worker.webhooks import Deliverer

log = logging.getLogger(__name__)

START_MARGIN_SECONDS = 0.01


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Worker:
    def __init__(
        self,
        *,
        worker_id: str | None = None,
        concurrency: int | None = None,
        once: bool = False,
        max_runs: int | None = None,
        listen: bool | None = None,
        on_ready: Callable[["Worker"], None] | None = None,
    ) -> None:
        self.worker_id = worker_id or default_worker_id()
        # Where it runs, recorded on its attempts: a worker here kills what they leave behind.
        self.machine = machine()
        self._reaper = Reaper(self.machine)
        self.concurrency = max(1, concurrency or conf.WORKER_CONCURRENCY)
        self.once = once
        self.max_runs = max_runs
        self.on_ready = on_ready
        self.sqlite = connection.vendor == "sqlite"
        self.listen = (not self.sqlite) and (conf.WORKER_LISTEN if listen is None else listen)
        self.poll_seconds = conf.SQLITE_POLL_SECONDS if self.sqlite else conf.POLL_SECONDS
        conf.require()  # also under --skip-checks, and for settings made in code
        # Slots filled only with a run of an owner who has none running, so one owner's long runs
        # cannot keep another's queued (docs/design/fair-use.md). At least two slots stay open to
        # everyone: below three slots, keeping one would take half of them or more from a lone user.
        self.newcomer_slots = max(0, min(conf.WORKER_NEWCOMER_SLOTS, self.concurrency - 2))
        self.attempt_config = conf.attempt_config()
        self.shutdown_grace_seconds = conf.SHUTDOWN_GRACE_SECONDS
        self.sweep_seconds = conf.SWEEP_SECONDS
        if self.attempt_config.fence_after < 2 * self.attempt_config.heartbeat_seconds:
            log.warning(
                "RUNLEDGER_LEASE_SECONDS %ss leaves %.2fs between renewals once the unwinding time is set aside "
                "(RUNLEDGER_HEARTBEAT_SECONDS %ss, RUNLEDGER_CANCEL_GRACE_SECONDS %ss): one slow renewal stops "
                "an attempt",
                self.attempt_config.lease_seconds,
                self.attempt_config.fence_after,
                self.attempt_config.heartbeat_seconds,
                self.attempt_config.cancel_grace_seconds,
            )
        # Counters, for --max-runs and for whoever embeds a worker.
        self.claimed = 0
        self.finished = 0
        self._registry: AttemptRegistry[Execution] = AttemptRegistry()
        self._executions: dict[tuple[UUID, int], asyncio.Task[Any]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._stopping = False
        self._signals = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        # The wake-up at the soonest start a create's notification announced or a read found
        # (`_wake_at_start`); the read is made again only after a wake that may have passed it (the
        # timer's, the poll's, a reconnect's), not after a create's of a run due now.
        self._start_timer: asyncio.TimerHandle | None = None
        self._read_start = True
        # Told of a run to take (a create's notification, a start's timer): the next claim reads the
        # ranking with its pick, a round trip less; others, which mostly find nothing, first and alone.
        self._run_noted = False
        self._db: Db | None = None
        self._listener: Listener | None = None
        self._deliverer: Deliverer | None = None
        self._scheduler: Scheduler | None = None

    def __repr__(self) -> str:
        return f"<worker {self.worker_id}>"

    # --- running ---------------------------------------------------------------------------------

    def run(self, *, install_signals: bool = True) -> int:
        """Run until stopped (or, with --once / --max-runs, until done); returns the runs finished."""
        # The process's metrics set up at its start: a metrics directory that is refused stops it here.
        series.made()
        loop = asyncio.new_event_loop()
        switch = sys.getswitchinterval()
        # The loop thread (notifications, token trips) competes for the GIL with the database
        # threads; a shorter switch interval bounds how long a cancellation waits for it.
        sys.setswitchinterval(min(switch, 0.001))
        try:
            return loop.run_until_complete(self._main(install_signals))
        finally:
            sys.setswitchinterval(switch)
            # An abandoned agent may ignore cancellation for a long time; it does not hold up exit.
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=1))
            loop.run_until_complete(asyncio.wait([loop.create_task(loop.shutdown_asyncgens())], timeout=1))
            loop.close()

    def stop(self) -> None:
        """Ask the worker to stop gracefully; callable from any thread."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._request_stop)

    async def _main(self, install_signals: bool) -> int:
        self._loop = asyncio.get_running_loop()
        logs.bind_worker(self.worker_id)
        self._wake = asyncio.Event()
        self._db = Db(work_threads=min(max(2, self.concurrency), 4))
        self._deliverer = Deliverer(lane=self._db.webhooks, worker_id=self.worker_id, poll_seconds=self.poll_seconds)
        # On SQLite no notification says a schedule changed: it polls as the claim loop does.
        scheduler_poll = min(
            conf.SCHEDULER_POLL_SECONDS, self.poll_seconds if self.sqlite else conf.SCHEDULER_POLL_SECONDS
        )
        self._scheduler = Scheduler(lane=self._db.schedules, poll_seconds=scheduler_poll)
        poller: asyncio.Task[None] | None = None
        sweeper: asyncio.Task[None] | None = None
        delivering: asyncio.Task[None] | None = None
        scheduling: asyncio.Task[None] | None = None
        listening: asyncio.Task[None] | None = None
        try:
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    self._loop.add_signal_handler(sig, self._on_signal, sig)
            if self.listen:
                self._listener = Listener(
                    role="worker",
                    on_notify=self._on_notify,
                    on_connect=self._on_listener_connect,
                    channels=(notify.QUEUE, notify.CONTROL, notify.WEBHOOKS, notify.SCHEDULES),
                )
                listening = asyncio.create_task(self._listener.run(), name="listener")
                try:
                    await asyncio.wait_for(self._listener.connected.wait(), timeout=10)
                except TimeoutError:
                    log.warning("%s: LISTEN connection not up yet; polling meanwhile", self)
            # Before the first claim: that could be a run whose lost tool still runs here.
            await self._reap()
            log.info(
                "%s ready: concurrency %d (%d kept for owners with no run running), %s every %ss",
                self,
                self.concurrency,
                self.newcomer_slots,
                "LISTEN/NOTIFY and a re-read" if self.listen else "polling",
                self.poll_seconds,
            )
            if self.on_ready is not None:
                self.on_ready(self)
            poller = asyncio.create_task(self._poll_loop(), name="poll")
            sweeper = asyncio.create_task(self._sweep_loop(), name="sweep")
            delivering = asyncio.create_task(self._deliverer.run(), name="webhooks")
            scheduling = asyncio.create_task(self._scheduler.run(), name="schedules")
            await self._claim_loop()
            await self._shutdown()
        finally:
            # A request cut here is sent again once its claim's lease lapses (runs.services.webhooks).
            for task in (poller, sweeper, delivering, scheduling):
                if task is not None:
                    task.cancel()
            if self._listener is not None:
                self._listener.stop()
            if listening is not None:
                listening.cancel()
                await asyncio.wait([listening], timeout=2)
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    self._loop.remove_signal_handler(sig)
            # Blocking joins, but each thread is idle or about to be.
            self._db.stop()
        return self.finished

    def _on_signal(self, sig: int) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("%s: second %s; exiting now", self, signal.Signals(sig).name)
            # The processes its agents started live in sessions of their own: nothing would stop
            # them once this process is gone.
            for execution in self._registry:
                execution.steps.kill()
            os._exit(1)
        log.info("%s: %s; finishing at safe boundaries", self, signal.Signals(sig).name)
        self._request_stop()

    def _request_stop(self) -> None:
        self._stopping = True
        assert self._wake is not None
        self._wake.set()

    # --- claiming --------------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        assert self._wake is not None
        while not self._stopping:
            self._wake.clear()
            queue_empty = await self._claim_free_slots()
            if not self._executions and (
                (self.once and queue_empty) or (self.max_runs is not None and self.claimed >= self.max_runs)
            ):
                return
            if queue_empty and self._read_start:
                await self._arm_next_start()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.poll_seconds)
            except TimeoutError:
                self._read_start = True

    async def _arm_next_start(self) -> None:
        """A worker with free slots and nothing to claim sleeps no longer than the poll interval, nor
        past the soonest start_after among queued runs — no NOTIFY says that a time has come, and the
        poll alone would start it up to a whole interval late."""
        assert self._db is not None
        try:
            ahead = await self._db.work.call(queue_next_start_in)
        except DatabaseError as exc:
            log.warning("%s: could not read the next start time (%s); read at the next wake", self, exc)
        else:
            self._read_start = False
            if ahead is not None:
                # A little past it: the claim compares start_after with the database's clock.
                self._wake_at_start(ahead + START_MARGIN_SECONDS)

    async def _claim_free_slots(self) -> bool:
        """Claim until the slots are full; True when the queue had nothing left for us. The last
        `newcomer_slots` free slots take only runs of owners with none running (`run_claim(newcomer=)`):
        a wake-up of the claim loop — a create's notification, or the poll — fills one at once."""
        assert self._db is not None and self._loop is not None
        while len(self._executions) < self.concurrency and not self._stopping:
            if self.max_runs is not None and self.claimed >= self.max_runs:
                return False
            claimed_at = self._loop.time()
            newcomer = self.concurrency - len(self._executions) <= self.newcomer_slots
            noted, self._run_noted = self._run_noted, False
            try:
                claimed = await self._db.work.call(
                    services.run_claim, worker=self.worker_id, machine=self.machine, newcomer=newcomer, expect_run=noted
                )
            except DatabaseError as exc:
                log.warning("%s: could not claim (%s); retrying later", self, exc)
                return False
            if claimed is None:
                if newcomer and self.concurrency - len(self._executions) > self.newcomer_slots:
                    continue  # runs ended while it claimed: the slot is no longer only a newcomer's
                return True
            self.claimed += 1
            self._start(*claimed, claimed_at=claimed_at)
        return False

    def _start(self, run: Run, attempt: Any, *, claimed_at: float) -> None:
        assert self._db is not None
        execution = Execution(run=run, attempt=attempt, db=self._db, config=self.attempt_config, claimed_at=claimed_at)
        self._registry.register(execution)
        task = asyncio.create_task(execution.run(), name=repr(execution))
        self._executions[(execution.run_id, execution.generation)] = task
        task.add_done_callback(lambda t: self._execution_done(execution, t))
        attempt_fields = {"run_id": str(execution.run_id), "generation": execution.generation}
        log.info("%s: claimed %s", self, execution, extra={"event": "claimed", **attempt_fields})

    def _execution_done(self, execution: Execution, task: asyncio.Task[Any]) -> None:
        # Only this attempt's own entry goes: a newer attempt of the same run stays registered.
        self._registry.unregister(execution.run_id, execution.generation)
        self._executions.pop((execution.run_id, execution.generation), None)
        self.finished += 1
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: %s ended with an error", self, execution, exc_info=task.exception())
        assert self._wake is not None
        self._wake.set()  # a slot is free

    # --- control: notifications, the periodic re-read --------------------------------------------

    def _on_notify(self, channel: str, payload: str) -> None:
        assert self._wake is not None
        if channel == notify.QUEUE:
            ahead = notify.parse_queue_payload(payload)
            if ahead is None or ahead <= 0:
                self._run_noted = True
                self._wake.set()
            else:
                self._wake_at_start(ahead + START_MARGIN_SECONDS)
        elif channel == notify.WEBHOOKS:
            assert self._deliverer is not None
            self._deliverer.wake()
        elif channel == notify.SCHEDULES:
            assert self._scheduler is not None
            self._scheduler.wake()
        elif channel == notify.CONTROL:
            raw_id, status = notify.parse_control_payload(payload)
            try:
                run_id = UUID(raw_id)
            except ValueError:
                return
            held = self._registry.get(run_id)
            if held is None:
                return
            if status in TERMINAL:
                # A committed, absorbing fact (runs.notify): stop now, without the re-read's round trip.
                held.stop(f"the run is {status}", via="notification")
            else:
                self._spawn(self._recheck([(held.run_id, held.generation)], via="notification"))

    def _wake_at_start(self, seconds: float) -> None:
        """Wake the claim loop in `seconds`, when a run scheduled ahead falls due, unless it is woken
        sooner for another: no claim now, which would find nothing (fair-use.md#start-after)."""
        assert self._loop is not None and self._wake is not None
        when = self._loop.time() + seconds
        timer = self._start_timer
        if timer is not None and not timer.cancelled() and self._loop.time() < timer.when() <= when:
            return
        if timer is not None:
            timer.cancel()
        self._start_timer = self._loop.call_at(when, self._start_due)

    def _start_due(self) -> None:
        assert self._wake is not None
        self._read_start = True  # the next one is read once this one is claimed
        self._run_noted = True
        self._wake.set()

    def _on_listener_connect(self) -> None:
        # Whatever happened while the connection was down was not heard: re-read it all.
        assert self._wake is not None and self._deliverer is not None and self._scheduler is not None
        self._read_start = True
        self._wake.set()
        self._deliverer.wake()
        self._scheduler.wake()
        held = [(h.run_id, h.generation) for h in self._registry]
        if held:
            self._spawn(self._recheck(held, via="reconnect"))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self.poll_seconds)
            held = [(h.run_id, h.generation) for h in self._registry]
            if held:
                await self._recheck(held, via="poll")

    async def _recheck(self, held: list[tuple[UUID, int]], *, via: str) -> None:
        """Re-read the durable state of runs this worker holds and act on it: the database, not
        the notification, says whether an attempt must stop."""
        assert self._db is not None
        try:
            states = await self._db.control.call(run_worker_states, run_ids=[run_id for run_id, _ in held])
        except DatabaseError as exc:
            log.warning("%s: could not re-read run states (%s)", self, exc)
            return
        for run_id, generation in held:
            status, current, pause_requested_at = states.get(run_id, ("deleted", 0, None))
            execution = self._registry.get(run_id, generation)
            if execution is None:
                continue  # it ended meanwhile, or a newer attempt holds the run: not for it
            if status != Status.RUNNING or current != generation:
                execution.stop(f"the run is {status} (attempt {current})", via=via)
            elif pause_requested_at is not None:
                execution.request_pause()

    # --- the sweeper -----------------------------------------------------------------------------

    async def _reap(self, *, as_of: datetime | None = None) -> None:
        assert self._db is not None
        try:
            await self._db.sweep.call(self._reaper.sweep, as_of=as_of)
        except (DatabaseError, OSError) as exc:
            log.warning("%s: could not look for lost attempts' processes (%s)", self, exc)

    async def _sweep_loop(self) -> None:
        while True:
            await self._sweep()
            # Jittered, so the sweeps of workers started together spread out.
            await asyncio.sleep(self.sweep_seconds * random.uniform(0.8, 1.2))

    async def _sweep(self) -> None:
        assert self._db is not None
        try:
            # The reap and the sweep judge leases at one reading of the clock: a lease that lapsed
            # between the two would otherwise be requeued before this machine looked for its tool.
            as_of = await self._db.sweep.call(db_now)
        except DatabaseError as exc:
            log.warning("%s: could not sweep (%s)", self, exc)
            return
        # First: the sweep may requeue a run whose lost attempt's tool still runs here.
        await self._reap(as_of=as_of)
        try:
            swept = await self._db.sweep.call(services.runs_sweep, as_of=as_of)
        except DatabaseError as exc:
            log.warning("%s: could not sweep (%s)", self, exc)
            return
        if swept:
            log.info(
                "%s swept: requeued %s, failed (worker_lost) %s, stopped (deadline) %s",
                self,
                [str(r) for r in swept.requeued],
                [str(r) for r in swept.failed],
                [str(r) for r in swept.stopped],
                extra={"event": "swept"},
            )

    # --- stopping --------------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        if not self._executions:
            return
        log.info("%s: waiting up to %ss for %d attempts", self, self.shutdown_grace_seconds, len(self._executions))
        for execution in self._registry:
            execution.request_shutdown()
        await asyncio.wait(list(self._executions.values()), timeout=self.shutdown_grace_seconds)
        for execution in self._registry:
            execution.request_shutdown(force=True)
        if self._executions:
            await asyncio.wait(list(self._executions.values()), timeout=10)
