"""The runs whose end the edge's publisher published (docs/design/edge.md#late-holds): remembered a
while, and closed again `RUNLEDGER_GRIP_CLOSE_AGAIN_SECONDS` later (grip.close_again_item) for a
stream whose hold reached Pushpin after the first close. Only the publisher uses this, on its loop.
"""

import time
from collections import deque

# Runs that ended are remembered this long, so a late notification does not publish them again,
# and a sync closes the streams of those whose close a previous leader may not have sent.
ENDED_TTL = 300.0
# Remembered runs are looked through for those past ENDED_TTL only once there are this many.
FORGET_FROM = 1000


class Endings:
    def __init__(self, *, again_after: float) -> None:
        self.again_after = again_after
        # Run id -> when it ended (time.monotonic()) and the seq of its terminal event.
        self.at: dict[str, tuple[float, int]] = {}
        # The closes to send again, in the order they fall due: (when, run id, last seq). One delay
        # for all, so appending keeps the order.
        self.again: deque[tuple[float, str, int]] = deque()

    def __contains__(self, run_id: object) -> bool:
        return run_id in self.at

    def reset(self, ended: dict[str, int]) -> None:
        """A new leader's: the runs that ended within ENDED_TTL (run id -> last seq), whose streams
        its sync closes (publisher.py); none is due again, the sync's close being sent both ways."""
        now = time.monotonic()
        self.at = {run_id: (now, last_seq) for run_id, last_seq in ended.items()}
        self.again.clear()

    def add(self, run_id: str, last_seq: int) -> None:
        """`run_id` ended at `last_seq` and its close is published now: again after `again_after`."""
        now = time.monotonic()
        self.at[run_id] = (now, last_seq)
        self.again.append((now + self.again_after, run_id, last_seq))

    def recent(self) -> list[tuple[str, int]]:
        """Each run that ended within ENDED_TTL, with its last seq."""
        cutoff = time.monotonic() - ENDED_TTL
        return [(run_id, last_seq) for run_id, (at, last_seq) in self.at.items() if at >= cutoff]

    def due_in(self) -> float | None:
        """Seconds until the next close is due again; None when none is waiting."""
        return max(0.0, self.again[0][0] - time.monotonic()) if self.again else None

    def due(self) -> list[tuple[str, int]]:
        """The runs whose close is due again now (run id, last seq), taken off the list."""
        now = time.monotonic()
        found = []
        while self.again and self.again[0][0] <= now:
            _, run_id, last_seq = self.again.popleft()
            found.append((run_id, last_seq))
        return found

    def forget_old(self) -> None:
        if len(self.at) < FORGET_FROM:
            return
        cutoff = time.monotonic() - ENDED_TTL
        for run_id in [run_id for run_id, (at, _) in self.at.items() if at < cutoff]:
            del self.at[run_id]
