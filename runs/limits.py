"""The limits of DESIGN §5 and §6, read in one place, and the rule their settings obey.

Every limit is a number ≥ 0 where 0 means unlimited. Values from the environment are refused at
settings load (config/settings.py); `check_limits` is the system check for values set in code, so
neither way slips past a process's start (`runs.E003`).
"""

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

# Whole numbers ≥ 0; 0 = unlimited (or, for the defaults, none given; for the newcomer slots, none kept).
WHOLE_LIMITS = (
    "RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER",
    "RUNLEDGER_MAX_RUNS_PER_USER",
    "RUNLEDGER_MAX_STORED_BYTES_PER_USER",
    "RUNLEDGER_MAX_PAGE_BYTES",
    "RUNLEDGER_MAX_LIST_VALUE_BYTES",
    "RUNLEDGER_MAX_RUNNING_PER_USER",
    "RUNLEDGER_WORKER_NEWCOMER_SLOTS",
    "RUNLEDGER_MAX_STREAMS_PER_USER",
    "RUNLEDGER_DEFAULT_MAX_EVENTS",
    "RUNLEDGER_DEFAULT_MAX_STEPS",
    "RUNLEDGER_DEFAULT_DEADLINE_SECONDS",
    "RUNLEDGER_AUTH_FAILURES_MAX",
)
# Seconds ≥ 0; 0 = unlimited.
SECONDS_LIMITS = ("RUNLEDGER_SSE_MAX_SECONDS",)
# Seconds > 0: a wait between two looks, or a window.
POSITIVE_SECONDS = (
    "RUNLEDGER_SSE_RECHECK_SECONDS",
    "RUNLEDGER_AUTH_FAILURE_WINDOW_SECONDS",
    "RUNLEDGER_LIMIT_RETRY_AFTER_SECONDS",
)


def limit(name: str) -> int | None:
    """The limit `name` as a whole number, or None when it is 0 (unlimited)."""
    value = int(getattr(settings, name))
    return value or None


def retry_after() -> int:
    return int(settings.RUNLEDGER_LIMIT_RETRY_AFTER_SECONDS)


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and value == value and value != float("inf")


def limit_problems() -> list[str]:
    problems = []
    for name in WHOLE_LIMITS:
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            problems.append(f"{name} must be a whole number ≥ 0 (0 = unlimited), not {value!r}")
    for name in SECONDS_LIMITS:
        value = getattr(settings, name)
        if not _is_number(value) or value < 0:
            problems.append(f"{name} must be a number of seconds ≥ 0 (0 = unlimited), not {value!r}")
    for name in POSITIVE_SECONDS:
        value = getattr(settings, name)
        if not _is_number(value) or value <= 0:
            problems.append(f"{name} must be a number of seconds above 0, not {value!r}")
    return problems


def check_limits(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return [checks.Error(problem, id="runs.E003") for problem in limit_problems()]


def require_limits() -> None:
    """For the processes that serve (the web application, `runworker`), also under --skip-checks."""
    problems = limit_problems()
    if problems:
        raise ImproperlyConfigured("; ".join(problems))
