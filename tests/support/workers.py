"""Runs that worker processes execute: waiting for their progress, and for a worker to take the next one."""

from django.contrib.auth.models import User

from runs.models import Run
from tests.factories import queued_run
from tests.support.runs import attempt, delta_count, fresh
from tests.support.waiting import wait_until


def wait_status(run: Run, *statuses: str, timeout: float = 15) -> Run:
    return wait_until(
        lambda: (r := fresh(run)).status in statuses and r,
        timeout=timeout,
        what=f"run {run.pk} becoming {'/'.join(statuses)}",
    )


def wait_streaming(run: Run, deltas: int = 3) -> None:
    wait_until(lambda: delta_count(run) >= deltas, what=f"{deltas} deltas of run {run.pk}")


def prove_worker_moved_on(owner: User, worker_id: str) -> Run:
    """The worker is alive and free again: it takes and completes the next run."""
    nxt = queued_run(owner, input={"deltas": 2, "delay_ms": 1})
    done = wait_status(nxt, "completed")
    found = attempt(done)
    assert found is not None and found.worker == worker_id
    return done
