"""A run as the database holds it: fresh reads of its row, attempts and events, and waits on them.

Every read goes to the database (never a cached instance), so that a test sees what another
process or thread committed.
"""

from django.contrib.auth.models import User

from runs.models import Run, RunAttempt, RunEvent
from tests.factories import queued_run
from tests.support.waiting import wait_until


def fresh(run: Run) -> Run:
    return Run.objects.get(pk=run.pk)


def status_of(run: Run) -> str:
    return str(Run.objects.values_list("status", flat=True).get(pk=run.pk))


def attempt(run: Run, generation: int = 1) -> RunAttempt | None:
    return RunAttempt.objects.filter(run_id=run.pk, generation=generation).first()


def released(run: Run, generation: int = 1) -> RunAttempt | None:
    found = attempt(run, generation)
    return found if found is not None and found.released_at is not None else None


def event_types(run: Run) -> list[str]:
    return list(RunEvent.objects.filter(run_id=run.pk).order_by("seq").values_list("type", flat=True))


def stored_text(run: Run) -> str:
    deltas = RunEvent.objects.filter(run_id=run.pk, type="output.delta").order_by("seq")
    return "".join(e.data["text"] for e in deltas)


def delta_count(run: Run) -> int:
    return RunEvent.objects.filter(run_id=run.pk, type="output.delta").count()


def deltas_of(run: Run, generation: int) -> int:
    return RunEvent.objects.filter(run_id=run.pk, type="output.delta", attempt=generation).count()


# --- waiting on runs that worker processes execute ----------------------------------------------


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
