"""Cancel committed → released per kind of step: await, child process, thread abandon, HTTP stream.

    .venv/bin/python -m bench step_kinds [--quick] [--samples N] [--background 200] [--trace]

How it works: docs/benchmarks.md#method-step_kinds.
"""

import argparse
import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.lib import (
    RESULTS,
    app_running,
    durable_cluster,
    floor_command,
    floor_option,
    git_revision,
    log,
    machine_facts,
    percentile,
    postgres_facts,
    run_floor,
)
from bench.trace_cancel import STAGES
from bench.trace_cancel import read as read_trace
from tests.support.agents import AGENTS_ENV

# Sizes, also bench/run_all.py's: 200 background runs; the steps last a minute, so that every
# cancel lands mid-step.
FULL = {"step_samples": 100, "step_background": 200, "step_delay_ms": 1000, "step_tool_ms": 60_000}
QUICK = {**FULL, "step_samples": 30}


def concurrency(background: int) -> int:
    """Slots per worker (two workers) for the background runs and the one run measured, with room
    to spare however unevenly the two workers claim."""
    return background // 2 + 20


# --- the report (from the JSON alone: bench/run_all.py --render uses it) ------------------------------

SETTINGS = {"alone": "one at a time", "under_load": "{n} running"}


def _ms(v: float) -> str:
    return f"{v:,.1f}" if abs(v) >= 10 else f"{v:,.2f}"


def _floor(f: dict[str, Any]) -> str:
    lcw, notified = f["lock_check_write_ms"], f["txn_start_to_notified_ms"]
    return (
        f"lock-check-write p50 {_ms(lcw['p50'])} / p99 {_ms(lcw['p99'])} ms, "
        f"txn → NOTIFY received p50 {_ms(notified['p50'])} / p99 {_ms(notified['p99'])} ms"
    )


def _settings(r: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, figures) of each setting measured."""
    return [(label.format(n=r[key].get("background_runs")), r[key]) for key, label in SETTINGS.items() if key in r]


def rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per kind and setting: the figures, its target (one at a time only) and whether met."""
    out = []
    for label, setting in _settings(r):
        for kind, k in setting["kinds"].items():
            s = k["released_after_commit_ms"]
            target = r["targets_p99_ms_one_at_a_time"][kind] if setting is r["alone"] else None
            out.append(
                {
                    "kind": kind,
                    "setting": label,
                    **{p: s[p] for p in ("n", "p50", "p95", "p99", "max")},
                    "waits_by_design_ms": r.get("waits_by_design_ms", {}).get(kind, 0),
                    "target_p99_ms": target,
                    "met": None if target is None else s["p99"] <= target,
                    "outcomes": k["outcomes"],
                    "logs_sound": k["logs_sound"],
                }
            )
    return out


def markdown(r: dict[str, Any], floor: dict[str, Any]) -> str:
    """The per-kind table with its conditions and the floor measured in the same run."""
    alone, loaded = r["alone"], r.get("under_load")
    busy = f"{alone['cpu']['machine_cpu_busy_pct']}% one at a time"
    floors = f"{_floor(floor)}"
    if loaded:
        busy += (
            f", {loaded['cpu']['machine_cpu_busy_pct']}% on top of {loaded['background_runs']} demo runs streaming "
            f"a delta every {loaded['background_delay_ms']} ms ({loaded['background_deltas_per_s']} deltas/s "
            f"committed meanwhile; {loaded['background_running_after']} still running at the end)"
        )
        if loaded["floor_under_load"]:
            floors += f"; under that load: {_floor(loaded['floor_under_load'])}"
    lines = [
        f"Cancel committed → released, per kind of step: {r['samples_per_kind']} cancels per kind and setting "
        f"through the service, each mid-step (steps of {r['tool_ms'] / 1000:g} s), the next only once the last "
        f"was released; RUNLEDGER_CANCEL_GRACE_SECONDS {r['cancel_grace_seconds']:g} s. Released = the "
        "attempt's `released_at` (the worker's clock once it had stopped executing, just before it writes it) "
        f"minus the return of `run_cancel`. Machine CPU busy: {busy}. Floor in the same run: {floors}.",
        "",
        "| step kind | setting | n | p50 | p95 | p99 | max | target p99 | met | attempt outcomes | logs sound |",
        "|---|---|---:|---:|---:|---:|---:|---:|:-:|---|---:|",
    ]
    for row in rows(r):
        target = "" if row["target_p99_ms"] is None else f"≤ {row['target_p99_ms']:g} ms"
        met = "" if row["met"] is None else ("yes" if row["met"] else "**no**")
        outcomes = ", ".join(f"{o} {n}" for o, n in sorted(row["outcomes"].items()))
        times = " | ".join(f"{_ms(row[p])} ms" for p in ("p50", "p95", "p99", "max"))
        lines.append(
            f"| {row['kind']} | {row['setting']} | {row['n']} | {times} | {target} | {met} | {outcomes} "
            f"| {row['logs_sound']}/{row['n']} |"
        )
    seen = [
        f"{label}: p50 {_ms(d['p50'])}, p99 {_ms(d['p99'])} ms"
        for label, setting in _settings(r)
        if (d := setting["kinds"].get("HTTP stream", {}).get("server_disconnect_after_commit_ms"))
    ]
    lines += [
        "",
        "A sound log ends with the tool call sealed `interrupted`, then `run.cancelled` (the HTTP-stream agent "
        "makes no tool call: its one stored line, then `run.cancelled`). The local model server saw the HTTP "
        f"stream's disconnect, after the commit — {'; '.join(seen)}.",
    ]
    return "\n".join(lines) + "\n"


# The stretches between the traced stages (from the commit when the first is None), to tell where
# the slowest cancels lost their time.
SEGMENTS = (
    ("to the loop", None, "recheck"),  # the notification heard and the re-read queued
    ("re-read", "recheck", "read"),  # the control lane's thread reads the run's state
    ("trip", "read", "tripped"),  # back on the loop, the token trips
    ("unwind", "tripped", "close"),  # the agent's task cancelled and unwound
    ("steps", "close", "closed"),  # processes reaped, threads waited for or abandoned, streams closed
)


def _after_commit(sample: dict[str, Any], trace: dict[str, dict[str, list[float]]]) -> dict[str, float]:
    """When each stage of one cancellation happened, ms after its commit (the first stamp of each)."""
    stamps = trace.get(sample["run_id"], {})
    out = {stage: (times[0] - sample["committed_at"]) * 1000 for stage, times in stamps.items()}
    return out | {"released": sample["released_after_commit_ms"]}


def stages(r: dict[str, Any], trace: dict[str, dict[str, list[float]]]) -> list[dict[str, Any]]:
    """Per kind and setting, when each traced stage happened after the commit (p50, p99 in ms;
    `released` is the attempt's `released_at`), and for the slowest 5 % of the cancels the mean
    length of each stretch between stages."""
    out = []
    for label, setting in _settings(r):
        for kind, k in setting["kinds"].items():
            timed = sorted((_after_commit(s, trace) for s in k["samples"]), key=lambda t: t["released"])
            row: dict[str, Any] = {"kind": kind, "setting": label}
            for stage in (*STAGES, "released"):
                after = [t[stage] for t in timed if stage in t]
                if after:
                    row[stage] = [round(percentile(after, 50), 2), round(percentile(after, 99), 2)]
            slowest = timed[-max(1, len(timed) // 20) :]
            row["slowest"] = {"n": len(slowest), "from_ms": round(slowest[0]["released"], 2)}
            for name, first, last in SEGMENTS:
                spans = [
                    t[last] - (t[first] if first else 0) for t in slowest if last in t and (not first or first in t)
                ]
                if spans:
                    row["slowest"][name] = round(sum(spans) / len(spans), 2)
            out.append(row)
    return out


def stages_markdown(rows: list[dict[str, Any]]) -> str:
    heads = [s for s in (*STAGES, "released") if any(s in row for row in rows)]
    lines = [
        "Where the time goes: when each stage happened in the worker, ms after the commit (p50 / p99; "
        "bench/trace_cancel.py names the stages).",
        "",
        "| step kind | setting | " + " | ".join(heads) + " |",
        "|---|---|" + "---:|" * len(heads),
    ]
    for row in rows:
        cells = [f"{_ms(row[h][0])} / {_ms(row[h][1])}" if h in row else "" for h in heads]
        lines.append(f"| {row['kind']} | {row['setting']} | " + " | ".join(cells) + " |")
    names = [name for name, _, _ in SEGMENTS]
    lines += [
        "",
        "The slowest 5 % of the cancels: the mean length of each stretch, ms.",
        "",
        "| step kind | setting | cancels (released after) | " + " | ".join(names) + " |",
        "|---|---|---|" + "---:|" * len(names),
    ]
    for row in rows:
        slow = row["slowest"]
        cells = [_ms(slow[n]) if n in slow else "" for n in names]
        lines.append(
            f"| {row['kind']} | {row['setting']} | {slow['n']} (≥ {_ms(slow['from_ms'])} ms) | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK['step_samples']} cancels per kind and setting")
    parser.add_argument("--samples", type=int, help=f"cancels per kind and setting (default {FULL['step_samples']})")
    parser.add_argument("--background", type=int, default=FULL["step_background"], help="background runs")
    parser.add_argument("--delay-ms", type=int, default=FULL["step_delay_ms"], help="the background runs' pace")
    parser.add_argument("--tool-ms", type=int, default=FULL["step_tool_ms"], help="how long each step would last")
    parser.add_argument("--trace", action="store_true", help="also trace each cancellation's stages in the workers")
    floor_option(parser)
    parser.add_argument("--out", default=str(RESULTS / "step_kinds.json"))
    args = parser.parse_args()
    samples = args.samples or (QUICK if args.quick else FULL)["step_samples"]
    env = dict(AGENTS_ENV)
    if args.trace:
        fd, trace_path = tempfile.mkstemp(prefix="runledger-trace-", suffix=".txt")
        os.close(fd)
        env["BENCH_TRACE_FILE"] = trace_path
        env["RUNLEDGER_AGENTS"] += ",bench.trace_cancel"
    machine = machine_facts(idle_seconds=3)
    with durable_cluster() as cluster:
        floor_url = cluster.create_database("floor")
        floor = run_floor(floor_url, *args.floor_args)
        with app_running(cluster, workers=2, concurrency=concurrency(args.background), env=env) as ctx:
            from bench import scenarios_steps

            machine.update(postgres_facts())
            log(f"cancelling {samples} runs of each kind, alone and on top of {args.background} running runs")
            result = scenarios_steps.step_kinds(
                ctx,
                samples=samples,
                background=args.background,
                delay_ms=args.delay_ms,
                tool_ms=args.tool_ms,
                # The floor again under the load costs half a minute: the full run only.
                floor=None if args.quick else floor_command(floor_url),
            )
    report = {
        "benchmark": "step_kinds",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "revision": git_revision(),
        "machine": machine,
        "floor": floor,
        **result,
    }
    if args.trace:
        report["stages"] = stages(report, read_trace(trace_path))
        os.unlink(trace_path)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    m = machine
    print(
        f"{m['nproc']} x {m['cpu']}, {m['memory_gib']} GiB, PostgreSQL {m['postgresql']} (fsync {m['postgresql_fsync']}), "
        f"Python {m['python']}; CPU {m['cpu_busy_pct_before_start']}% busy before the run (other users), "
        f"load average {m['load_average'][0]}; revision {report['revision']}\n"
    )
    print(markdown(report, floor))
    if args.trace:
        print(stages_markdown(report["stages"]))
    print(f"written to {out}")
    return 0
