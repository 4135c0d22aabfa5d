"""Profile one benchmark scenario with py-spy (pip install -e '.[dev]'): which functions the web
process (or a worker) spends its samples in while the scenario runs.

    .venv/bin/python -m bench profile replay [--target web|worker] [--events 100000]
    .venv/bin/python -m bench profile watchers --watchers 1000
    .venv/bin/python -m bench profile cancel-http --runs 100
    .venv/bin/python -m bench profile start | stream

Same setup as bench/run_all.py (a durable throwaway cluster, one uvicorn process, two workers).
Writes the collapsed stacks (bench/results/profile-<scenario>-<target>.txt, for speedscope or
flamegraph.pl) and prints the top functions by inclusive and by own samples.
"""

import argparse
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.lib import RESULTS, app_running, durable_cluster


def top(collapsed: Path, n: int = 25) -> dict[str, list[tuple[str, int]]]:
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        samples = int(count)
        total += samples
        frames = stack.split(";")
        for frame in set(frames):
            inclusive[frame] += samples
        own[frames[-1]] += samples
    return {
        "total": [("samples", total)],
        "inclusive": inclusive.most_common(n),
        "own": own.most_common(n),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", choices=["replay", "watchers", "cancel-http", "cancel-service", "start", "stream"])
    parser.add_argument("--target", choices=["web", "worker"], default="web")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--watchers", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--idle", action="store_true", help="include idle (waiting) frames")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"profile-{args.scenario}-{args.target}.txt"
    with durable_cluster() as cluster, app_running(cluster, workers=2, concurrency=args.runs // 2 + 20) as ctx:
        from bench import scenarios as sc

        prepared: Any = None
        if args.scenario in ("replay", "stream"):
            prepared = sc.make_running_run(ctx, args.events, label="profile")
            sc.complete(prepared)
        pid = ctx.web.pid if args.target == "web" else ctx.workers[0].pid
        cmd = [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid), "--rate", str(args.rate)]
        cmd += ["--format", "raw", "--output", str(out), "--threads"]
        if args.idle:
            cmd.append("--idle")
        spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.5)
        t0 = time.time()
        if args.scenario == "replay":
            result, _ = sc.replay(ctx, events=args.events, run=prepared)
        elif args.scenario == "stream":
            result = sc.stream_one(ctx, events=args.events)
        elif args.scenario == "watchers":
            result = sc.watchers(ctx, n=args.watchers, events=100, interval=0.1)
        elif args.scenario == "start":
            result = sc.start(ctx, samples=30)
        else:
            via = args.scenario.split("-")[1]
            result = sc.cancel(ctx, runs=args.runs, delay_ms=1000, gap_ms=30, via=via)
        elapsed = time.time() - t0
        spy.send_signal(signal.SIGINT)
        _, err = spy.communicate(timeout=60)
    print(json.dumps(result, indent=1, default=str)[:3000])
    print(f"scenario took {elapsed:.1f} s; py-spy: {err.decode()[-300:]}")
    report = top(out)
    total = report["total"][0][1] or 1
    for kind in ("inclusive", "own"):
        print(f"\n--- {kind} (of {total} samples)")
        for frame, count in report[kind]:
            print(f"{100 * count / total:5.1f}%  {frame[:150]}")
    print(f"\ncollapsed stacks: {out}")
    return 0
