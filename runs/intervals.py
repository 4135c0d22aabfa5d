"""The lease timing an attempt derives from the interval settings, and the rule they must obey
together (docs/design/execution.md#leases). Pure arithmetic: `runs.conf` gives the settings
(`conf.attempt_config()`) and checks this rule with the others (`runs.E002`).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class AttemptConfig:
    heartbeat_seconds: float
    lease_seconds: float
    cancel_grace_seconds: float
    batch_max: int

    @property
    def margin(self) -> float:
        # For a timer that fires late on a busy loop, and the reaping after the last SIGKILL.
        return self.heartbeat_seconds / 4

    @property
    def unwind_seconds(self) -> float:
        """The longest a stopped attempt takes to stop: its task, child processes and threads get
        until one deadline, one grace after the stop; killing and reaping what is left, and closing
        its generator, share one more (`runs.worker.steps`)."""
        return 2 * self.cancel_grace_seconds

    @property
    def fence_after(self) -> float:
        """Seconds after a renewal was sent that the attempt stops itself if none succeeded since:
        the lease, less the time to unwind and the margin, so that it has stopped when the lease
        lapses. More than a heartbeat, so the next renewal (sent one heartbeat later) has time to
        succeed."""
        return self.lease_seconds - self.margin - self.unwind_seconds

    def problem(self) -> str | None:
        """Why these settings cannot work together, or None (each alone is checked by its kind)."""
        if self.fence_after <= self.heartbeat_seconds:
            # Each attempt would stop itself before its next renewal could land: every run would
            # lose attempt after attempt until it failed worker_lost.
            minimum = self.heartbeat_seconds + self.margin + self.unwind_seconds
            return (
                f"RUNLEDGER_LEASE_SECONDS {self.lease_seconds:g} s is too short for RUNLEDGER_HEARTBEAT_SECONDS "
                f"{self.heartbeat_seconds:g} s and RUNLEDGER_CANCEL_GRACE_SECONDS {self.cancel_grace_seconds:g} s: "
                f"an attempt needs a heartbeat, {self.unwind_seconds:g} s to unwind (twice the grace) and a "
                f"{self.margin:g} s margin within its lease, so the lease must be longer than {minimum:g} s"
            )
        return None
