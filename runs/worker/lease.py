"""An attempt's lease and the heartbeat that renews it (docs/design/execution.md#leases). Self-fencing:
the lease is counted from when the last successful renewal (or the claim) was sent, on the loop's
monotonic clock, and `AttemptConfig.fence_after` seconds later the attempt stops itself and writes
no more, whatever held it up, so it has stopped before any sweeper may requeue the run.
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from uuid import UUID

from runs import services
from runs.agents.base import CancellationToken
from runs.intervals import AttemptConfig
from runs.worker.db import TRANSIENT_DB_ERRORS, Db

log = logging.getLogger(__name__)


async def sleep_unless_tripped(token: CancellationToken, seconds: float) -> None:
    """Sleep, waking early when the token trips."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(token.wait(), timeout=seconds)


@dataclass
class Lease:
    """The lease of one attempt, renewed by `keep()` until the attempt's token trips.

    `stop(reason, via=...)` is the attempt's own way of stopping: the lease calls it when the
    lease lapsed (`lost` is then true: the worker gave the attempt up) or when a renewal finds the
    attempt closed by someone else. The attempt's writer writes under it."""

    run_id: UUID
    generation: int
    db: Db
    config: AttemptConfig
    token: CancellationToken
    stop: Callable[..., None]
    # Loop time when the last successful renewal (at first: the claim) was sent.
    renewed_at: float
    # How the attempt is named in the log.
    label: str
    lost: bool = False

    def fence_at(self) -> float:
        return self.renewed_at + self.config.fence_after

    def lapsed(self) -> bool:
        return asyncio.get_running_loop().time() >= self.fence_at()

    def lose(self, when: str) -> None:
        if not self.token.tripped:
            log.warning("%s: could not renew its lease in time (%s); stopping it", self.label, when)
        self.lost = True
        self.stop("its lease lapsed", via="heartbeat")

    async def keep(self) -> None:
        """Renew the lease every heartbeat until the token trips, or stop the attempt."""
        loop = asyncio.get_running_loop()
        interval = self.config.heartbeat_seconds
        while not self.token.tripped:
            # Wake at the fence at the latest: a renewal that keeps failing must not let the
            # attempt run past it for want of a check.
            await sleep_unless_tripped(self.token, max(0.0, min(interval, self.fence_at() - loop.time())))
            if self.token.tripped:
                return
            if self.lapsed():
                self.lose("no renewal succeeded")
                return
            sent = loop.time()
            try:
                renewed = await asyncio.wait_for(
                    self.db.control.call(
                        services.run_attempt_heartbeat, run_id=self.run_id, generation=self.generation
                    ),
                    # A renewal answered after the fence counts for nothing: stop waiting then.
                    timeout=max(0.01, self.fence_at() - sent),
                )
            except (TimeoutError, *TRANSIENT_DB_ERRORS) as exc:
                if self.lapsed():
                    self.lose(str(exc) or "the renewal timed out")
                    return
                log.warning("%s: heartbeat failed (%s); retrying", self.label, exc)
                continue
            if not renewed:
                self.stop("the attempt is no longer the run's", via="heartbeat")
                return
            self.renewed_at = sent
