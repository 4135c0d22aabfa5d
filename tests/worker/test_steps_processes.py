"""Durable steps in real worker processes (docs/design/execution.md#steps): a worker SIGKILLed after
a step's result is stored does not make the next attempt call the step again, and a cancel during
a retry's backoff releases the attempt as promptly as during any step.

The steps' tool counts its calls in a file outside the database, as a real side effect would be.
"""

from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from runs import services
from runs.events import EventType
from runs.models import AttemptOutcome, Run, RunEvent
from tests.factories import queued_run
from tests.support.agents import AGENTS_ENV, NOTE
from tests.support.checks import assert_nothing_after_terminal
from tests.support.procs import FAST_INTERVALS, Procs, subprocess_env
from tests.support.runs import fresh, released
from tests.support.waiting import wait_until
from tests.support.workers import wait_status

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.processes,
    pytest.mark.timeout(90),
    pytest.mark.sqlite,
]

LEASE = float(FAST_INTERVALS["RUNLEDGER_LEASE_SECONDS"])
# Cancel → released, at most, as for every kind of step (tests/worker/test_step_kinds.py): the
# worker hears of the cancel (a notification, or the 0.5 s poll), then unwinds within two graces.
PROMPTLY = timedelta(seconds=2)


def events(run: Run, *types: str) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run_id=run.pk, type__in=types).order_by("seq"))


def test_a_worker_killed_after_a_step_completed_leaves_the_step_done_once_and_the_output_exact(
    procs: Procs, alice: User, tmp_path: Path
) -> None:
    env = subprocess_env(**AGENTS_ENV)
    first = procs.worker("w1", env=env)
    calls, hold = tmp_path / "calls", tmp_path / "go-on"
    run = queued_run(
        alice, agent="test-steps", input={"calls": str(calls), "steps": ["search", "write"], "hold": str(hold)}
    )
    # Step "search" is stored; the agent holds before its next emit until `hold` exists.
    wait_until(lambda: events(run, EventType.STEP_COMPLETED), what="the first step's result")

    first.kill()
    procs.worker("w2", env=env)
    wait_until(lambda: fresh(run).generation == 2, timeout=LEASE + 10, what="the next attempt")
    hold.touch()

    run = wait_status(run, "completed", "failed", timeout=30)
    assert (run.status, run.lost_attempts) == ("completed", 1), run.end_reason
    # The tool ran once per step, the first in the first attempt only.
    assert calls.read_text().splitlines() == [f"search {run.pk}:1", f"write {run.pk}:2"]
    assert run.output == {
        "results": [{"name": "search", "key": f"{run.pk}:1"}, {"name": "write", "key": f"{run.pk}:2"}]
    }
    # Nothing the first attempt stored is stored again.
    logged = [(e.type, e.attempt) for e in events(run, NOTE, EventType.STEP_COMPLETED, EventType.OUTPUT_DELTA)]
    assert logged == [
        (NOTE, 1),
        (EventType.STEP_COMPLETED, 1),
        (NOTE, 2),
        (EventType.STEP_COMPLETED, 2),
        (EventType.OUTPUT_DELTA, 2),
    ]
    assert run.steps_used == 2
    assert_nothing_after_terminal(run)


def test_a_cancel_during_a_retrys_30_second_backoff_releases_the_attempt_promptly(
    procs: Procs, alice: User, tmp_path: Path
) -> None:
    procs.worker("w1", env=subprocess_env(**AGENTS_ENV))
    input = {"calls": str(tmp_path / "calls"), "steps": ["one"], "fail": "one", "fail_times": 5, "backoff": 30}
    run = queued_run(alice, agent="test-steps", input=input)
    (retrying,) = wait_until(lambda: events(run, EventType.STEP_RETRYING), what="the first retry")
    assert retrying.data["wait"] >= 15

    services.run_cancel(run_id=run.pk, actor=alice)

    gone = wait_until(lambda: released(run), what="the attempt's release")
    run = fresh(run)
    assert run.status == "cancelled" and gone.outcome == AttemptOutcome.CANCELLED
    assert gone.released_at is not None and run.ended_at is not None
    assert gone.released_at - run.ended_at < PROMPTLY
    assert len((tmp_path / "calls.failed").read_text().splitlines()) == 1  # never called again
