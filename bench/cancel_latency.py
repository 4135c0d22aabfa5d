"""Cancel latency: from a cancel request's start to its committed response, and to the worker's release.

    .venv/bin/python -m bench cancel_latency [--runs 200] [--delay-ms 1000] [--via service,http]

How it works: docs/benchmarks.md#method-cancel_latency.
"""

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path

from bench.lib import RESULTS, app_running, durable_cluster, machine_facts, postgres_facts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200, help="runs to cancel per path (at least 200 for the report)")
    parser.add_argument("--delay-ms", type=int, default=1000, help="the demo runs' pace between deltas")
    parser.add_argument("--gap-ms", type=int, default=30, help="pause between two cancels")
    parser.add_argument("--via", default="service,http", help="service, http or both (comma-separated)")
    parser.add_argument("--out", default=str(RESULTS / "cancel_latency.json"))
    args = parser.parse_args()
    machine = machine_facts()
    results = {}
    with durable_cluster() as cluster, app_running(cluster, workers=2, concurrency=args.runs // 2 + 20) as ctx:
        from bench import scenarios as sc

        machine.update(postgres_facts())
        for via in args.via.split(","):
            print(f"cancelling {args.runs} streaming runs via {via}", flush=True)
            results[via] = sc.cancel(ctx, runs=args.runs, delay_ms=args.delay_ms, gap_ms=args.gap_ms, via=via)
    report = {"benchmark": "cancel_latency", "at": datetime.now(UTC).isoformat(), "machine": machine, **results}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'':22} {'p50':>8} {'p95':>8} {'p99':>8} {'max':>8}  (ms)")
    for via, r in results.items():
        for key in ("committed_ms", "released_ms", "released_after_commit_ms"):
            s = r[key]
            print(f"{via + ' ' + key[:-3]:22} {s['p50']:8.1f} {s['p95']:8.1f} {s['p99']:8.1f} {s['max']:8.1f}")
        print(f"{'':22} CPU during the cancels: {r['cpu_during_cancels']}")
    print(f"written to {out}")
    return 0
