"""The app's signals, for host code (docs/reference/python.md#runs-signals; the promise:
docs/design/clients.md#python-api)."""

from functools import partial

from django.db import transaction
from django.dispatch import Signal

from runs.models import Run

__all__ = ["run_ended"]

run_ended = Signal()
"""Sent once for every run that ends — `completed`, `failed`, `cancelled` or `stopped`, whoever
ended it (a command, its worker, the sweeper, its parent's end) — after the transaction that
ended it commits: a receiver that reads the run anywhere finds it ended, and a rollback sends
nothing.

Arguments: `sender` is `runs.models.Run`; `run` the run as it ended (`run.id`, `run.status`,
`run.end_code`, `run.end_reason`, `run.ended_by`, `run.ended_at`, `run.output`, `run.error`).

It is sent in the process and thread that ended the run — a web process for a command, a worker
for its run's completion, the process that sweeps for a deadline — so connect receivers where
every process loads them (an `AppConfig.ready()`). Receivers run before that call returns: keep
them short, and hand slow work to a queue. A receiver that raises is logged (logger
`django.dispatch`); the others still run and the run stays ended.
"""


def send_run_ended(run: Run) -> None:
    """Send `run_ended` for the locked `run`, which the caller's transaction ends, once it commits."""
    transaction.on_commit(partial(run_ended.send_robust, sender=Run, run=run), robust=True)
