"""Webhooks: deliveries per second by two workers, commit → delivered latency at a steady load, and
what an endpoint adds to a cancel's transaction (docs/design/webhooks.md).

    .venv/bin/python -m bench webhooks [--burst 2000] [--steady 400] [--rate 20] [--cancels 300]

How it works: docs/benchmarks.md#method-webhooks.
"""

import argparse
import json
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.lib import RESULTS, app_running, durable_cluster, machine_facts, postgres_facts, summary
from tests.support.procs import Procs, free_port, wait_log_line
from tests.support.waiting import wait_until
from tests.support.webhook_receiver import received

EVENTS = ["run.cancelled"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, kind, default in (
        ("burst", int, 2000),
        ("steady", int, 400),
        ("rate", float, 20.0),
        ("cancels", int, 300),
    ):
        parser.add_argument(f"--{name}", type=kind, default=default)
    parser.add_argument("--out", default=str(RESULTS / "webhooks.json"))
    args = parser.parse_args()
    machine = machine_facts()
    env = {"RUNLEDGER_WEBHOOKS_ALLOW_PRIVATE": "1"}
    with durable_cluster() as cluster, app_running(cluster, workers=2, concurrency=4, env=env) as ctx:
        machine.update(postgres_facts())
        from django.contrib.auth.models import User
        from django.db import connection, transaction
        from django.test.utils import CaptureQueriesContext
        from django.utils import timezone

        from runs import services
        from runs.services import RunSpec
        from runs.services.core import end
        from runs.services.creation import insert_run
        from runs.services.webhook_endpoints import webhook_create
        from runs.transitions import CancelCode, Status

        logs = Path(ctx.web.log_path).parent
        port = free_port()
        secrets, log = logs / "secrets.json", logs / "received.jsonl"
        endpoint = webhook_create(owner=ctx.user, url=f"http://127.0.0.1:{port}/in", events=EVENTS)
        secrets.write_text(json.dumps([endpoint.secret]))
        cmd = [sys.executable, "-m", "tests.support.webhook_receiver", str(port), str(secrets), str(log)]
        procs = Procs(logs)
        receiver = procs.start("receiver", cmd, {"PYTHONUNBUFFERED": "1", "PATH": "/usr/bin:/bin"})
        try:
            wait_log_line(receiver, "receiver ready", timeout=30)
            later = timezone.now() + timedelta(days=1)
            spec = RunSpec(agent="demo", input={"deltas": 1}, start_after=later)

            def verified_runs() -> dict[str, float]:
                return {str(line["run_id"]): float(line["at"]) for line in received(log) if line.get("verified")}

            # Burst: every notification due at one commit.
            print(f"burst: {args.burst} runs ending in one transaction", flush=True)
            with transaction.atomic():
                for _ in range(args.burst):
                    run = insert_run(spec, owner=ctx.user, capped=False)
                    end(run, Status.CANCELLED, code=CancelCode.BY_USER, reason="", by="bench", now=timezone.now())
            committed = time.time()
            wait_until(lambda: len(verified_runs()) >= args.burst, timeout=600, interval=0.2, what="the burst")
            last = max(verified_runs().values())
            burst = {
                "notifications": args.burst,
                "seconds": round(last - committed, 2),
                "per_second": round(args.burst / (last - committed), 1),
            }
            print(f"  {burst}", flush=True)

            # Steady: one cancel every 1/rate seconds.
            print(f"steady: {args.steady} cancels at {args.rate}/s", flush=True)
            ids = [
                services.run_create(owner=ctx.user, agent="demo", input={}, start_after=later).pk
                for _ in range(args.steady)
            ]
            commits: dict[str, float] = {}
            began = time.monotonic()
            for i, run_id in enumerate(ids):
                time.sleep(max(0.0, began + i / args.rate - time.monotonic()))  # the load's own pace
                services.run_cancel(run_id=run_id, actor=ctx.user)
                commits[str(run_id)] = time.time()
            wait_until(lambda: set(commits) <= set(verified_runs()), timeout=300, interval=0.2, what="steady")
            arrived = verified_runs()
            steady = summary([(arrived[r] - t) * 1000 for r, t in commits.items()])
            print(f"  commit → delivered ms: {steady}", flush=True)

            # Cost: the same cancel, by an owner with no endpoint and by one with one.
            bare = User.objects.create_user("bench-bare", password="x")
            print(f"cost: {args.cancels} cancels each, without and with an endpoint", flush=True)
            timings: dict[str, list[float]] = {"without": [], "with": []}
            statements: dict[str, int] = {}
            for _ in range(args.cancels):
                for label, owner in (("without", bare), ("with", ctx.user)):
                    run = services.run_create(owner=owner, agent="demo", input={}, start_after=later)
                    with CaptureQueriesContext(connection) as queries:
                        start = time.perf_counter()
                        services.run_cancel(run_id=run.pk, actor=owner)
                        timings[label].append((time.perf_counter() - start) * 1000)
                    statements[label] = len(queries.captured_queries)
            cost = {label: {"ms": summary(ms), "statements": statements[label]} for label, ms in timings.items()}
            print(f"  {cost}", flush=True)
        finally:
            procs.stop_all()
    report = {
        "benchmark": "webhooks",
        "at": datetime.now(UTC).isoformat(),
        "machine": machine,
        "burst": burst,
        "steady": {"rate_per_second": args.rate, "cancels": args.steady, "commit_to_delivered_ms": steady},
        "cancel_cost": cost,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {out}")
    return 0
