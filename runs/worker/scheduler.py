"""The worker's scheduler (docs/design/schedules.md#scheduler): fires due schedules, exactly once
whatever the number of workers (each fire under the schedule's row lock, SKIP LOCKED), and sleeps
until the soonest due time, woken sooner by the schedules' notification. No leader: every worker
runs one."""

import asyncio
import contextlib
import logging

from django.db import DatabaseError

from runs.selectors.schedules import schedules_next_due_in
from runs.services.firing import schedules_fire
from runs.worker.db import DbLane

log = logging.getLogger(__name__)

# Fires per call on the lane: between two, the loop hears a stop.
BATCH = 50
# A little past the due time: the fire compares it with the database's clock.
DUE_MARGIN_SECONDS = 0.005
# A schedule due that another worker holds: it commits its fire within a few milliseconds.
HELD_SECONDS = 0.05


class Scheduler:
    """The loop; `wake()` when a notification says a schedule changed or a scheduled run ended."""

    def __init__(self, *, lane: DbLane, poll_seconds: float) -> None:
        self.lane = lane
        self.poll_seconds = poll_seconds
        self.fired = 0
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            self._wake.clear()
            wait = await self._fire()
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=wait)

    async def _fire(self) -> float:
        """Fire what is due; how long to sleep then (0: more may be due)."""
        try:
            fired = await self.lane.call(schedules_fire, limit=BATCH)
            self.fired += fired
            if fired == BATCH:
                return 0
            ahead = await self.lane.call(schedules_next_due_in)
        except DatabaseError as exc:
            # A database restart: the lane's thread drops its connection and opens another at the
            # next call; a fire cut mid-transaction rolled back and is still due.
            log.warning("scheduler: could not fire schedules (%s); retrying later", exc)
            return self.poll_seconds
        except Exception:
            # Never the loop's end: the next poll tries again.
            log.exception("scheduler: firing schedules failed")
            return self.poll_seconds
        if ahead is None:
            return self.poll_seconds
        if ahead <= 0:
            return 0 if fired else HELD_SECONDS
        return min(self.poll_seconds, ahead + DUE_MARGIN_SECONDS)
