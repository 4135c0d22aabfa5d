"""bin/test's workers (pytest-xdist, --dist loadgroup, tests/support/schedule.py) take the tests of
one group together: a module's process tests on one worker, one after the other, so its
module-wide processes start once — shown on a made-up suite run by a real pytest with two workers."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.procs import ROOT

# Two modules of six tests each, each module one group, with a module-wide fixture that logs
# where it started.
MODULE = """
import os

import pytest


@pytest.fixture(scope="module")
def started():
    with open(os.environ["STARTS"], "a") as log:
        log.write(f"{__name__} {os.environ['PYTEST_XDIST_WORKER']}\\n")


@pytest.mark.xdist_group(__name__)
@pytest.mark.parametrize("i", range(6))
def test_one(started, i):
    pass
"""


# A pytest of its own with two workers: several seconds, not for bin/test --quick.
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_groups_tests_run_on_one_worker_and_its_module_fixture_starts_once(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text('pytest_plugins = ["tests.support.schedule"]\n')
    for name in ("test_first.py", "test_second.py"):
        (suite / name).write_text(MODULE)
    starts = tmp_path / "starts.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DJANGO_"))}
    env.update(PYTHONPATH=str(ROOT), STARTS=str(starts))
    args = ["-m", "pytest", "-p", "no:cacheprovider", "-p", "no:django", "-q", "-n", "2", "--dist", "loadgroup"]
    done = subprocess.run(
        [sys.executable, *args, str(suite)], cwd=suite, env=env, capture_output=True, text=True, timeout=100
    )

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "12 passed" in done.stdout
    assert sorted(line.split()[0] for line in starts.read_text().splitlines()) == ["test_first", "test_second"]
