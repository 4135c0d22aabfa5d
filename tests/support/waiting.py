"""The one way tests wait: poll a condition against a deadline (never a bare sleep)."""

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T], timeout: float = 15, what: str = "the condition", interval: float = 0.02
) -> T:
    """Poll `predicate` (e.g. a database read) every `interval` seconds until it returns something
    truthy, and return that; TimeoutError if it has not within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout}s")
        time.sleep(interval)  # polling a condition; the deadline above bounds it
    return value
