"""Cancel latency: from a cancel request to its committed response, and to the worker's release.

    .venv/bin/python bench/cancel_latency.py [--runs 60] [--workers 2] [--concurrency 40]

Starts a durable throwaway PostgreSQL cluster (`bin/pgcluster start DIR --durable`) unless
`--database-url` (or DATABASE_URL, a postgres:// URL) names one, migrates it, starts `--workers`
worker processes, creates `--runs` demo runs that stream for a long time, waits until every one
is running, then cancels them one by one from this process through the service layer and
measures, per run:
- committed: the cancel call → its return (the command's transaction committed), and
- released: the cancel call → the attempt's `released_at` (the worker stopped executing it).
Prints p50/p95/p99/max and writes JSON (default bench/results/cancel_latency.json).
"""

import argparse
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary(ms: list[float]) -> dict[str, float]:
    return {
        "n": len(ms),
        "p50": round(percentile(ms, 50), 2),
        "p95": round(percentile(ms, 95), 2),
        "p99": round(percentile(ms, 99), 2),
        "max": round(max(ms), 2),
        "mean": round(statistics.fmean(ms), 2),
    }


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout}s")
        time.sleep(0.05)
    return value


def start_cluster(workdir: Path) -> tuple[str, Path]:
    pgdir = workdir / "pg"
    out = subprocess.run(
        [str(ROOT / "bin" / "pgcluster"), "start", str(pgdir), "--durable"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()[-1], pgdir


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=60, help="runs to cancel (at least 50 for the report)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=40, help="runs each worker executes at once")
    parser.add_argument("--delay-ms", type=int, default=200, help="the demo runs' pace between deltas")
    parser.add_argument("--gap-ms", type=int, default=30, help="pause between two cancels")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", ""))
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "cancel_latency.json"))
    args = parser.parse_args()
    if args.workers * args.concurrency < args.runs:
        parser.error("--workers times --concurrency must hold every run at once")

    workdir = Path(tempfile.mkdtemp(prefix="runledger-bench-"))
    workdir.chmod(0o755)  # the PostgreSQL server runs as another user and must reach its folder
    pgdir: Path | None = None
    workers: list[subprocess.Popen[bytes]] = []
    try:
        url = args.database_url
        if not url.startswith("postgres"):
            url, pgdir = start_cluster(workdir)
            print(f"durable PostgreSQL cluster at {url}")
        os.environ["DATABASE_URL"] = url
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()
        from django.contrib.auth.models import User
        from django.core.management import call_command
        from django.db import connection

        from runs import services
        from runs.models import Run, RunAttempt, RunEvent

        call_command("migrate", verbosity=0)
        user, _ = User.objects.get_or_create(username="bench")

        env = {**os.environ, "PYTHONUNBUFFERED": "1", "DATABASE_URL": url}
        logs = []
        concurrency = ["--concurrency", str(args.concurrency)]
        for i in range(args.workers):
            log_path = workdir / f"worker-{i}.log"
            logs.append(log_path)
            with log_path.open("wb") as log_file:
                workers.append(
                    subprocess.Popen(
                        [sys.executable, "manage.py", "runworker", "--worker-id", f"bench-{i}", *concurrency],
                        cwd=ROOT,
                        env=env,
                        stdout=log_file,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        for i, log_path in enumerate(logs):
            wait_for(lambda p=log_path, i=i: f"runworker bench-{i} ready" in p.read_text(), 60, f"worker {i} ready")

        runs = [
            services.run_create(owner=user, agent="demo", input={"deltas": 1_000_000, "delay_ms": args.delay_ms})
            for _ in range(args.runs)
        ]
        ids = [r.pk for r in runs]

        def all_streaming() -> bool:
            running = Run.objects.filter(pk__in=ids, status="running").count()
            streaming = RunEvent.objects.filter(run_id__in=ids, type="output.delta").values("run_id").distinct()
            return running == len(ids) and streaming.count() == len(ids)

        wait_for(all_streaming, 120, "every run streaming")
        print(f"{len(ids)} runs streaming on {args.workers} workers; cancelling them one by one")

        random.shuffle(runs)
        started: dict[Any, float] = {}
        committed_ms: list[float] = []
        for run in runs:
            t0 = time.time()
            services.run_cancel(run_id=run.pk, actor=user, note="bench")
            committed_ms.append((time.time() - t0) * 1000)
            started[run.pk] = t0
            time.sleep(args.gap_ms / 1000)

        def all_released() -> list[RunAttempt]:
            attempts = list(RunAttempt.objects.filter(run_id__in=ids, released_at__isnull=False))
            return attempts if len(attempts) == len(ids) else []

        attempts = wait_for(all_released, 60, "every release")
        released_ms = [(a.released_at.timestamp() - started[a.run_id]) * 1000 for a in attempts if a.released_at]
        # The worker's own share: from the cancel's commit (as the caller saw it) to the release.
        done_at = {run.pk: started[run.pk] + ms / 1000 for run, ms in zip(runs, committed_ms, strict=True)}
        stop_ms = [(a.released_at.timestamp() - done_at[a.run_id]) * 1000 for a in attempts if a.released_at]
        outcomes = Counter(a.outcome for a in attempts)
        after_terminal = RunEvent.objects.filter(run_id__in=ids, type="run.cancelled").count()
        with connection.cursor() as cursor:
            cursor.execute("SELECT version()")
            pg_version = cursor.fetchone()[0]
        connection.close()
    finally:
        for proc in workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in workers:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        learnt = Counter(
            m for log_path in workdir.glob("worker-*.log") for m in re.findall(r"learnt by (\w+)", log_path.read_text())
        )
        if pgdir is not None:
            subprocess.run([str(ROOT / "bin" / "pgcluster"), "stop", str(pgdir)], check=False)
        shutil.rmtree(workdir, ignore_errors=True)

    result = {
        "benchmark": "cancel_latency",
        "at": datetime.now(UTC).isoformat(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "postgresql": pg_version,
        "durable_cluster": pgdir is not None,
        "config": {
            "runs": args.runs,
            "workers": args.workers,
            "concurrency": args.concurrency,
            "delay_ms": args.delay_ms,
            "gap_ms": args.gap_ms,
        },
        "committed_ms": summary(committed_ms),
        "released_ms": summary(released_ms),
        "released_after_commit_ms": summary(stop_ms),
        "attempt_outcomes": dict(outcomes),
        "cancelled_events": after_terminal,
        # How each worker learnt that an attempt must stop: notification, poll, heartbeat, fence, …
        "learnt_by": dict(learnt),
        "samples": {
            "committed_ms": [round(x, 3) for x in committed_ms],
            "released_ms": [round(x, 3) for x in released_ms],
        },
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'':14} {'p50':>8} {'p95':>8} {'p99':>8} {'max':>8}  (ms, n={len(released_ms)})")
    for name, label in (
        ("committed_ms", "committed"),
        ("released_ms", "released"),
        ("released_after_commit_ms", "after commit"),
    ):
        s = result[name]
        print(f"{label:14} {s['p50']:8.1f} {s['p95']:8.1f} {s['p99']:8.1f} {s['max']:8.1f}")
    print(f"learnt by: {dict(learnt)}; outcomes: {dict(outcomes)}; written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
