"""README's example, run from README's own text against a real web process and worker (one pair
for the module, tests/support/live.py): it creates a run, follows its stream, cancels it, and sees
the work stop."""

import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from runs.models import Run
from runs.transitions import CancelCode, Status
from tests.support.db import token_for
from tests.support.live import Live

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_example_streams_cancels_and_sees_the_work_stop(live: Live, alice: User) -> None:
    example = README.read_text().split("## An example", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    env = {**live.env, "RUNLEDGER_URL": live.web.url, "RUNLEDGER_TOKEN": token_for(alice)}
    done = subprocess.run([sys.executable, "-c", example], env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == f"{Status.CANCELLED} {CancelCode.BY_USER}"

    run = Run.objects.get(owner=alice)
    assert run.status == Status.CANCELLED and run.attempts.get().released_at is not None
    # Every event the example printed, once, in order: the stored log, ending at run.cancelled.
    printed = [line.split(" ", 2) for line in lines[:-1]]
    assert [int(seq) for seq, *_ in printed] == list(range(1, run.last_seq + 1))
    assert printed[-1][1] == "run.cancelled"
