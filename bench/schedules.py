"""Schedules: 10,000 due in the same minute fired by the workers' schedulers — each within 60 s?,
the lateness, fires per second — and one fire's cost against the floor (docs/design/schedules.md).

    .venv/bin/python -m bench schedules [--schedules 10000] [--users 100] [--workers 2] [--lead 20]
                                        [--fires 300] [--floor-args '...']

How it works: docs/benchmarks.md#method-schedules.
"""

import argparse
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.lib import (
    RESULTS,
    app_running,
    durable_cluster,
    floor_option,
    log,
    machine_facts,
    postgres_facts,
    run_floor,
    summary,
)
from tests.support.waiting import wait_until

# What every run a schedule creates runs: the least the demo agent does.
QUICK_RUN = {"deltas": 1, "delay_ms": 0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schedules", type=int, default=10_000, help="schedules due at the same instant")
    parser.add_argument("--users", type=int, default=100, help="their owners (100 each at most, as the cap says)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes, each running its scheduler")
    parser.add_argument("--lead", type=float, default=20, help="seconds from the setup to the due time")
    parser.add_argument("--fires", type=int, default=300, help="fires timed one by one in this process")
    parser.add_argument("--out", default=str(RESULTS / "schedules.json"))
    floor_option(parser)
    args = parser.parse_args()
    machine = machine_facts()
    # Each worker executes one run at a time: the runs are created, and executed slowly beside the fires.
    with durable_cluster() as cluster, app_running(cluster, workers=args.workers, concurrency=1) as ctx:
        machine.update(postgres_facts())
        from django.contrib.auth.models import User
        from django.db import connection
        from django.test.utils import CaptureQueriesContext
        from django.utils import timezone

        from runs import notify
        from runs.models import Run, Schedule
        from runs.services.firing import fire_next

        # No password: hashing one costs a third of a second.
        owners = [User.objects.create_user(f"scheduler-{i}") for i in range(args.users)]

        def schedules_due(at: datetime, n: int, prefix: str) -> None:
            now = timezone.now()
            rows = [
                Schedule(
                    owner=owners[i % len(owners)],
                    agent="demo",
                    input=QUICK_RUN,
                    metadata={"bench": prefix},
                    every_seconds=3600,
                    anchor=at,
                    start_at=at,
                    next_due_at=at,
                    created_at=now,
                    updated_at=now,
                )
                for i in range(n)
            ]
            Schedule.objects.bulk_create(rows, batch_size=1000)
            notify.send(notify.schedules_changed())

        due = (timezone.now() + timedelta(seconds=args.lead)).replace(microsecond=0)
        log(f"{args.schedules} schedules of {len(owners)} owners, all due at {due:%H:%M:%S}")
        schedules_due(due, args.schedules, "burst")
        fired = Run.objects.filter(schedule_due_at=due)
        wait_until(
            lambda: fired.count() >= args.schedules,
            timeout=args.lead + 600,
            interval=0.5,
            what=f"{args.schedules} fires",
        )
        created = [at for (at,) in fired.values_list("created_at")]
        late = [(at - due).total_seconds() for at in created]
        spread = (max(created) - min(created)).total_seconds()
        burst = {
            "schedules": args.schedules,
            "owners": len(owners),
            "workers": args.workers,
            "all_within_60_s": max(late) <= 60,
            "last_fired_after_s": round(max(late), 3),
            "lateness_ms": summary([s * 1000 for s in late]),
            "fires_per_second": round(args.schedules / spread, 1) if spread else None,
        }
        log(f"  {burst}")

        # One fire at a time, here, the workers stopped: what one costs, and its statements.
        for worker in ctx.workers:
            worker.stop(timeout=20)
        schedules_due(timezone.now() - timedelta(seconds=1), args.fires, "timed")
        ms: list[float] = []
        statements = 0
        for _ in range(args.fires):
            with CaptureQueriesContext(connection) as queries:
                started = time.perf_counter()
                assert fire_next() is not None
                ms.append((time.perf_counter() - started) * 1000)
            statements = len(queries.captured_queries)
        fire = {"ms": summary(ms), "statements": statements}
        log(f"  one fire: {fire}")
        floor = run_floor(cluster.create_database("scratch"), *args.floor_args)
    floor_ms = floor["lock_check_write_ms"]["p50"]
    report = {
        "benchmark": "schedules",
        "at": datetime.now(UTC).isoformat(),
        "machine": machine,
        "burst": burst,
        "fire": fire,
        "floor": {
            "lock_check_write_ms_p50": floor_ms,
            "x_floor": round(fire["ms"]["p50"] / floor_ms, 2) if floor_ms else None,
        },
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["floor"]))
    print(f"written to {out}")
    return 0
