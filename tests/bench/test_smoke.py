"""Every benchmark run at its smallest size, as a reader runs it (`python -m bench NAME` from the
repository's root), so that a change of the schema or of an API that breaks one fails the suite.
No figure is asserted: at these sizes they mean nothing."""

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from bench import floor, run_all
from bench.__main__ import benchmarks
from tests.support.docs import benchmarks_headline
from tests.support.procs import ROOT

# The floor that a benchmark measures beside its figures, at its least too.
FLOOR_SMOKE = f"--floor-args={' '.join(floor.SMOKE_OPTIONS)}"
# Each benchmark's options for its smallest run: one of each thing it does.
SMALLEST: dict[str, list[str]] = {
    "api_requests": ["--samples", "3", "--no-floor"],
    "bounded_answers": ["--runs", "2", "--input-kb", "4", "--parallel", "1", "--events", "2", "--event-kb", "4"],
    "bulk": ["--base", "8", "--samples", "2"],
    "cancel_latency": ["--runs", "2", "--delay-ms", "200"],
    "client_stream": ["--events", "50", "--cuts", "2", "--default-retry-cuts", "1"],
    "create_caps": ["--kept", "5", "--users", "2", "--samples", "2"],
    "dashboard": ["--repeats", "1", "--scale", "0.01"],
    "edge_vs_pushpin": [
        *("--runs", "2", "--per-run", "2", "--interval", "0.2", "--clients", "1"),
        *("--pushpin-seconds", "1", "--edge-seconds", "2", "--settle", "0.5"),
    ],
    "edge_watchers": [
        "--watchers",
        "4",
        "--direct-watchers",
        "2",
        "--events",
        "3",
        "--interval",
        "0.05",
        "--clients",
        "1",
    ],
    "fair_use": ["--size", "smoke"],
    "floor": ["{scratch}", *floor.SMOKE_OPTIONS],
    "model_stream": ["--cancels", "2", FLOOR_SMOKE],
    "profile": ["start", "--rate", "50"],
    # Each of its phases once, one growth tier; the phases it leaves out are the benchmarks it names in
    # run_all.SMOKE["skip"] (api_requests, step_kinds, client_stream, model_stream, fair_use), run here alone.
    "run_all": ["--size", "smoke"],
    "schedules": ["--schedules", "20", "--users", "2", "--workers", "1", "--lead", "3", "--fires", "3", FLOOR_SMOKE],
    "sse_watchers": ["--watchers", "3", "--events", "3", "--interval", "0.05"],
    "step_kinds": ["--samples", "1", "--background", "2", "--quick", FLOOR_SMOKE],
    "wait": ["--waiters", "2", "--rounds", "1"],
    "webhooks": ["--burst", "5", "--steady", "3", "--rate", "20", "--cancels", "2"],
}
# Those that drive Debian's Pushpin (bin/edge installs it), and the longest, which runs every other phase.
EDGE = {"edge_vs_pushpin", "edge_watchers"}
SECONDS = {"run_all": 300, "fair_use": 300}


def test_every_benchmark_has_a_smallest_run_here() -> None:
    assert sorted(SMALLEST) == benchmarks()


def test_run_all_leaves_out_of_its_smoke_run_only_benchmarks_smoke_run_alone() -> None:
    left_out = run_all.SMOKE["skip"]
    assert left_out and set(left_out) <= set(SMALLEST) - {"run_all"}
    assert run_all.FULL["skip"] == run_all.QUICK["skip"] == ()
    # The headline's requests are measured at every tier, the smoke run's too.
    assert "api_requests" not in left_out


def test_run_alls_smoke_run_grows_through_every_tier_a_full_run_does() -> None:
    tiers = [label for label, _, _ in run_all.SMOKE["tiers"]]
    assert (
        tiers == [label for label, _, _ in run_all.FULL["tiers"]] == [label for label, _, _ in run_all.QUICK["tiers"]]
    )


@pytest.fixture
def scratch_database() -> Iterator[str]:
    """A database of its own in the suite's cluster (DATABASE_URL), for the floor's tables."""
    cluster = urlsplit(os.environ["DATABASE_URL"])
    name = f"bench_scratch_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit((cluster.scheme, cluster.netloc, "/" + name, "", ""))
    finally:
        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.timeout(600)
# Each in a group of its own, not the module's (tests/conftest.py): bin/test's workers share them out.
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=[pytest.mark.xdist_group(f"bench-{n}"), *([pytest.mark.edge] if n in EDGE else [])])
        for n in sorted(SMALLEST)
    ],
)
def test_the_benchmark_runs_at_its_smallest_size(name: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    options = SMALLEST[name]
    if "{scratch}" in options:
        scratch = request.getfixturevalue("scratch_database")
        options = [scratch if o == "{scratch}" else o for o in options]
    log = tmp_path / "output.txt"
    env = {**os.environ, "BENCH_RESULTS": str(tmp_path / "results"), "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:
        bench = subprocess.Popen(
            [sys.executable, "-m", "bench", name, *options],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = bench.wait(timeout=SECONDS.get(name, 240))
        except subprocess.TimeoutExpired:
            code = None
        finally:
            if bench.poll() is None:
                # Interrupted, it stops what it started (its cluster, servers, workers) on the way out.
                bench.send_signal(signal.SIGINT)
                try:
                    bench.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(bench.pid, signal.SIGKILL)
                    bench.wait()
    assert code == 0, f"python -m bench {name} {' '.join(options)}: exit {code}\n{log.read_text()[-6000:]}"
    if name == "run_all":
        # What the docs' first table is rendered from, rendered: every figure through every tier.
        summary = tmp_path / "results" / "summary.json"
        table = benchmarks_headline().headline(summary)
        assert table.count("\n| ") == 2 + len(json.loads(summary.read_text())["headline"]["rows"])
        assert "| x10 / x1 | x100 / x1 |" in table
