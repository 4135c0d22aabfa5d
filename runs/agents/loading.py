"""Loading the agents a deployment names in `RUNLEDGER_AGENTS` (docs/design/execution.md#agents).

Every process imports them when Django starts (`RunsConfig.ready`). A module that cannot be
imported is remembered rather than raised there, so `manage.py check` can report it as a system
check error; the processes that would run or accept runs — the web application and
`manage.py runworker` — refuse to start with the same message (`require_agents`).
"""

import importlib
from collections.abc import Sequence
from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from runs.conf import AppSettings, conf

_failures: list[str] = []


def load_agents(paths: Sequence[str] | None = None) -> list[str]:
    """Import every module in `paths` (default: the setting); the problems, one line each."""
    if paths is None:
        if conf.problem(AppSettings.AGENTS) is not None:
            _failures.clear()  # not a list of module paths: runs.conf says so (runs.E002)
            return []
        paths = conf.AGENTS
    problems = []
    for path in paths:
        try:
            importlib.import_module(path)
        except Exception as exc:
            problems.append(f"RUNLEDGER_AGENTS names {path!r}, which cannot be imported: {type(exc).__name__}: {exc}")
    _failures[:] = problems
    return problems


def require_agents() -> None:
    """Stop the calling process if any agent module failed to load."""
    if _failures:
        raise ImproperlyConfigured("; ".join(_failures))


def check_agents(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return [
        checks.Error(problem, hint="Fix the module or remove it from RUNLEDGER_AGENTS.", id="runs.E001")
        for problem in _failures
    ]
