"""Retry policies of durable steps (docs/design/execution.md#steps): `Retry`, the error an agent
raises to ask for a retry (`RetryableError`, with the least wait a server asked for) and the error
`ctx.step` raises once its policy is exhausted (`StepFailed`)."""

import math
from dataclasses import dataclass
from typing import Any


class RetryableError(Exception):
    """A failure worth trying again (a 429, a 503, a reset connection). `retry_after` is the least
    wait, in seconds, before the next call — a server's `Retry-After`."""

    def __init__(self, message: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class StepFailed(Exception):
    """A step's every call failed with an error its policy retries: uncaught, the run fails
    `agent_error` with this message, which names the step."""

    def __init__(self, name: str, ordinal: int, calls: int, error: BaseException) -> None:
        super().__init__(f"step {name!r} (#{ordinal}) failed {calls} times; last: {type(error).__name__}: {error}")
        self.name = name
        self.ordinal = ordinal
        self.error = error


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"Retry: {what} must be a finite number of seconds ≥ 0, not {value!r}")
    return float(value)


@dataclass(frozen=True)
class Retry:
    """How a step is retried: `attempts` counts every call, the first included; the wait before
    call n + 1 is drawn from the upper half of `backoff` * 2**(n - 1) seconds, at most `max_backoff`,
    and is never shorter than the error's `retry_after`. Only the errors of `retry_on` are
    retried; any other goes to the agent at once."""

    attempts: int = 3
    backoff: float = 1.0
    max_backoff: float = 30.0
    retry_on: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError, RetryableError)

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f"Retry: attempts counts every call, at least 1, not {self.attempts!r}")
        _seconds(self.backoff, "backoff")
        _seconds(self.max_backoff, "max_backoff")
        if not isinstance(self.retry_on, tuple) or not all(
            isinstance(kind, type) and issubclass(kind, Exception) for kind in self.retry_on
        ):
            raise ValueError(f"Retry: retry_on must be a tuple of exception classes, not {self.retry_on!r}")

    def retries(self, error: BaseException, *, call: int) -> bool:
        """Whether call number `call` (1 for the first), which raised `error`, is followed by another."""
        return call < self.attempts and isinstance(error, self.retry_on)

    def wait(self, error: BaseException, *, call: int, draw: float) -> float:
        """The wait before the call after `call`; `draw` in [0, 1) is the jitter (spreading the
        retries of many runs that failed together)."""
        ceiling = min(self.max_backoff, self.backoff * 2 ** min(call - 1, 64))
        seconds = ceiling * (1 + draw) / 2
        least = getattr(error, "retry_after", None)
        if isinstance(least, int | float) and not isinstance(least, bool) and math.isfinite(least):
            seconds = max(seconds, float(least))
        return seconds


# One call, never retried.
NO_RETRY = Retry(attempts=1)
# A step's policy when it names none.
DEFAULT_RETRY = Retry()
