"""The interval settings and the rules they obey, with the lease timing an attempt derives from
them (DESIGN §4, §7).

`check_intervals` is a system check (`manage.py check` runs it, and so does every management
command at start); the worker refuses to start on the same problems (`require_intervals`), so a
setting made in code rather than in the environment cannot slip past either.
"""

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured


@dataclass(frozen=True)
class AttemptConfig:
    heartbeat_seconds: float
    lease_seconds: float
    cancel_grace_seconds: float
    batch_max: int

    @classmethod
    def configured(cls) -> "AttemptConfig":
        """As the settings say (`runs.checks` tells whether they can work)."""
        return cls(
            heartbeat_seconds=float(settings.RUNLEDGER_HEARTBEAT_SECONDS),
            lease_seconds=float(settings.RUNLEDGER_LEASE_SECONDS),
            cancel_grace_seconds=float(settings.RUNLEDGER_CANCEL_GRACE_SECONDS),
            batch_max=int(settings.RUNLEDGER_APPEND_BATCH_MAX),
        )

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
        """Why these settings cannot work, or None."""
        if self.heartbeat_seconds <= 0 or self.lease_seconds <= 0 or self.cancel_grace_seconds < 0:
            return (
                "RUNLEDGER_HEARTBEAT_SECONDS and RUNLEDGER_LEASE_SECONDS must be positive and "
                f"RUNLEDGER_CANCEL_GRACE_SECONDS at least 0 (they are {self.heartbeat_seconds}, "
                f"{self.lease_seconds} and {self.cancel_grace_seconds})"
            )
        if self.batch_max < 1:
            return f"RUNLEDGER_APPEND_BATCH_MAX must be at least 1, not {self.batch_max}"
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


# Intervals that must be more than zero: a loop waits this long between two looks.
POSITIVE_INTERVALS = (
    "RUNLEDGER_POLL_SECONDS",
    "RUNLEDGER_SQLITE_POLL_SECONDS",
    "RUNLEDGER_SWEEP_SECONDS",
    "RUNLEDGER_SSE_KEEPALIVE_SECONDS",
    "RUNLEDGER_LISTEN_RECONNECT_SECONDS",
)
# Intervals where zero means "at once".
NON_NEGATIVE_INTERVALS = ("RUNLEDGER_SHUTDOWN_GRACE_SECONDS", "RUNLEDGER_CANCEL_GRACE_SECONDS")


def _number(name: str) -> float | None:
    value = getattr(settings, name)
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return None
    return float(value)


def interval_problems() -> list[str]:
    problems = []
    for name in POSITIVE_INTERVALS:
        value = _number(name)
        if value is None or value <= 0:
            problems.append(f"{name} must be a number of seconds above 0, not {getattr(settings, name)!r}")
    for name in NON_NEGATIVE_INTERVALS:
        value = _number(name)
        if value is None or value < 0:
            problems.append(f"{name} must be a number of seconds of at least 0, not {getattr(settings, name)!r}")
    if not problems:
        lease = AttemptConfig.configured().problem()
        if lease is not None:
            problems.append(lease)
    return problems


def require_intervals() -> None:
    problems = interval_problems()
    if problems:
        raise ImproperlyConfigured("; ".join(problems))


def check_intervals(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return [checks.Error(problem, id="runs.E002") for problem in interval_problems()]
