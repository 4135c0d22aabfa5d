"""Every benchmark against its floor, in one run on one throwaway durable cluster, at x1 and with
x10 and x100 stored history; its headline (bench/headline.py) leads docs/benchmarks.md.

    .venv/bin/python -m bench run_all [--quick | --size smoke] [--no-growth]

How it works: docs/benchmarks.md#method-run_all.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import client_stream, fair_use, headline, lib, model_stream, step_kinds
from bench.floor import SMOKE_OPTIONS as FLOOR_SMOKE
from runs.events import EventType
from tests.support.agents import AGENTS_ENV
from tests.support.procs import ROOT

FULL: dict[str, Any] = {
    "cancel_runs": 200,
    "cancel_delay_ms": 1000,
    "start_samples": 40,
    "append_deltas": 10_000,
    "many_runs": 20,
    "many_deltas": 2_000,
    "stream_events": 10_000,
    "watchers": [10, 100, 1000],
    "watch_events": 100,
    "watch_interval": 0.1,
    # How long the web process idles with its watchers before its memory is read, and the workers
    # stream before the cancels start (past the claim burst), in seconds.
    "watch_settle": 2.0,
    "claim_settle": 1.0,
    "replay_events": 100_000,
    # bench/floor.py's options (its defaults).
    "floor_args": [],
    # Background rows per growth tier: (label, total runs, events per run).
    "tiers": [("x10", 10_000, 10), ("x100", 100_000, 10)],
    "growth_cancel_runs": 100,
    "growth_watchers": 100,
    # openai_chat runs cancelled one at a time (bench/model_stream.py).
    "model_cancels": 40,
    # Requests of each kind one at a time (bench/api_requests.py).
    "request_samples": 300,
    **step_kinds.FULL,
    **client_stream.FULL,
    # Phases left out, by the name of the module that measures them standalone (see SMOKE).
    "skip": (),
}
QUICK: dict[str, Any] = {
    **FULL,
    "cancel_runs": 50,
    "start_samples": 10,
    "append_deltas": 3_000,
    "many_runs": 6,
    "many_deltas": 1_000,
    "stream_events": 3_000,
    "watchers": [10, 100],
    "watch_events": 40,
    "replay_events": 20_000,
    "tiers": [("x10", 2_000, 10), ("x100", 20_000, 10)],
    "growth_cancel_runs": 50,
    "model_cancels": 30,
    "request_samples": 150,
    **step_kinds.QUICK,
    **client_stream.QUICK,
}
# Each of its own phases once at the least that runs it (the CI's smoke run, tests/bench/: its figures
# mean nothing), both growth tiers; without the phases whose module the suite smoke-runs on its own
# (but with the requests of the headline, which every tier measures).
SMOKE: dict[str, Any] = {
    **QUICK,
    "skip": ("step_kinds", "client_stream", "model_stream", "fair_use"),
    "floor_args": list(FLOOR_SMOKE),
    "cancel_runs": 2,
    "cancel_delay_ms": 100,
    "start_samples": 2,
    "append_deltas": 20,
    "many_runs": 2,
    "many_deltas": 10,
    "stream_events": 20,
    "watchers": [2],
    "watch_events": 3,
    "watch_interval": 0.02,
    "watch_settle": 0.2,
    "claim_settle": 0.1,
    "replay_events": 100,
    "tiers": [("x10", 10, 10), ("x100", 20, 10)],
    "growth_cancel_runs": 2,
    "growth_watchers": 2,
    "model_cancels": 2,
    "request_samples": 3,
    "step_samples": 1,
    "step_background": 2,
    "client_events": 50,
    "client_cuts": 2,
    "client_default_retry_cuts": 1,
}
SIZES = {"full": FULL, "quick": QUICK, "smoke": SMOKE}

# The fast paths' targets are the headline's (bench/headline.py); these, the rest of the report's.
TARGETS = {
    **headline.TARGETS,
    "cancel_committed_p99_ms": 25,
    "cancel_released_p99_ms": 100,
    "watchers_1000_p99_ms": 150,
    "replay_sse_100k_s": 0.8,
    "replay_json_100k_s": 1.2,
    "web_kb_per_stream": 50,
}


def tier_suite(
    ctx: Any, cfg: dict[str, Any], *, full: bool, replay_run: Any, floor_url: str
) -> tuple[dict[str, Any], Any]:
    from bench import scenarios as sc

    out: dict[str, Any] = {}
    timings: dict[str, float] = {}

    def phase(name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        lib.log(f"  {name}")
        t0 = time.time()
        value = fn(*args, **kwargs)
        timings[name] = round(time.time() - t0, 1)
        return value

    # Every tier: the headline's figures grow or not with the stored history.
    if "api_requests" not in cfg["skip"]:
        from bench.api_requests import measure as one_at_a_time

        out["requests"] = phase("one request at a time", one_at_a_time, ctx, samples=cfg["request_samples"], bare=full)
    levels = cfg["watchers"] if full else [cfg["growth_watchers"]]
    out["watchers"] = {
        str(n): phase(
            f"watchers {n}",
            sc.watchers,
            ctx,
            n=n,
            events=cfg["watch_events"],
            interval=cfg["watch_interval"],
            settle=cfg["watch_settle"],
        )
        for n in levels
    }
    out["replay"], replay_run = phase(
        "replay", sc.replay, ctx, events=cfg["replay_events"], run=None if full else replay_run
    )
    out["stream_one"] = phase("stream one client", sc.stream_one, ctx, events=cfg["stream_events"])
    out["start"] = phase("start", sc.start, ctx, samples=cfg["start_samples"] if full else cfg["start_samples"] // 2)
    out["append_one"] = phase("append one run", sc.append_one, ctx, deltas=cfg["append_deltas"])
    out["append_many"] = phase(
        "append many runs", sc.append_many, ctx, runs=cfg["many_runs"], deltas=cfg["many_deltas"]
    )
    runs = cfg["cancel_runs"] if full else cfg["growth_cancel_runs"]
    for via in ("service", "http"):
        out[f"cancel_{via}"] = phase(
            f"cancel via {via} ({runs} runs)",
            sc.cancel,
            ctx,
            runs=runs,
            delay_ms=cfg["cancel_delay_ms"],
            gap_ms=30,
            via=via,
            floor=lib.floor_command(floor_url, *cfg["floor_args"]) if full and via == "service" else None,
            settle=cfg["claim_settle"],
        )
    if full and "step_kinds" not in cfg["skip"]:
        from bench import scenarios_steps

        out["step_kinds"] = phase(
            f"cancel per kind of step ({cfg['step_samples']} each, alone and under {cfg['step_background']} runs)",
            scenarios_steps.step_kinds,
            ctx,
            samples=cfg["step_samples"],
            background=cfg["step_background"],
            delay_ms=cfg["step_delay_ms"],
            tool_ms=cfg["step_tool_ms"],
        )
    if full and "client_stream" not in cfg["skip"]:
        out["client_stream"] = phase(
            "Python client: stream and resume",
            client_stream.measure,
            ctx,
            events=cfg["client_events"],
            cuts=cfg["client_cuts"],
            default_retry_cuts=cfg["client_default_retry_cuts"],
        )
    out["phase_seconds"] = timings
    return out, replay_run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--quick",
        action="store_const",
        const="quick",
        dest="size",
        default="full",
        help="smaller sizes (about 3 minutes, and 2 more for bench/fair_use.py)",
    )
    size.add_argument("--size", choices=SIZES, default="full", help="full, quick, or smoke (each phase once, tiny)")
    parser.add_argument("--no-growth", action="store_true", help="skip the x10 / x100 tiers")
    parser.add_argument("--out", default=str(lib.RESULTS), help="folder for summary.json and summary.md")
    parser.add_argument("--render", metavar="JSON", help="only print the markdown of an earlier summary.json")
    args = parser.parse_args()
    if args.render:
        print(markdown(json.loads(Path(args.render).read_text())), end="")
        return 0
    cfg = SIZES[args.size]
    began = time.time()
    # The machine's own load before the start; a smoke run's figures mean nothing, so a glance is enough.
    machine = lib.machine_facts(idle_seconds=0.2 if args.size == "smoke" else 3)
    result: dict[str, Any] = {
        "benchmark": "run_all",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "revision": lib.git_revision(),
        "mode": args.size,
        "config": {k: v for k, v in cfg.items()},
        "machine": machine,
        "targets": TARGETS,
    }
    # The model server first: every process lib.app_running starts then loads openai_chat against it.
    with lib.durable_cluster() as cluster, model_stream.model_server() as model:
        lib.log(f"durable cluster at {cluster.url}")
        floor_url = cluster.create_database("floor")
        result["floor"] = lib.run_floor(floor_url, *cfg["floor_args"])
        lib.log(f"floor: {result['floor']}")
        concurrency = step_kinds.concurrency(max(cfg["cancel_runs"], cfg["many_runs"], cfg["step_background"]))
        # openai_chat (set by model_server) beside the step kinds' test agents.
        agents = {"RUNLEDGER_AGENTS": f"{os.environ['RUNLEDGER_AGENTS']},{AGENTS_ENV['RUNLEDGER_AGENTS']}"}
        with lib.app_running(cluster, workers=2, concurrency=concurrency, env=agents) as ctx:
            from bench import scenarios as sc

            machine.update(lib.postgres_facts())
            tiers: dict[str, Any] = {}
            lib.log("tier x1 (only the benchmark's own rows)")
            tiers["x1"], replay_run = tier_suite(ctx, cfg, full=True, replay_run=None, floor_url=floor_url)
            if "model_stream" not in cfg["skip"]:
                lib.log(f"  cancel → model stream closed ({cfg['model_cancels']} openai_chat runs, one at a time)")
                tiers["x1"]["model_stream"] = model_stream.measure(ctx, model, cancels=cfg["model_cancels"])
            if not args.no_growth:
                have = 0
                for label, total_runs, per_run in cfg["tiers"]:
                    lib.log(f"tier {label}: inserting background rows")
                    added = sc.add_background(ctx.url, runs=total_runs - have, events_per_run=per_run)
                    have = total_runs
                    lib.log(f"  {added}")
                    tiers[label], _ = tier_suite(ctx, cfg, full=False, replay_run=replay_run, floor_url=floor_url)
                    tiers[label]["background"] = added
                    # The machine's state at this tier: the same raw work, measured again now.
                    tiers[label]["floor"] = lib.run_floor(floor_url, *cfg["floor_args"])
                result["explain_at_largest_tier"] = sc.explain(ctx, replay_run.pk)
            tiers["x1"]["floor"] = result["floor"]
            result["tiers"] = tiers
            result["web_process_log_tail"] = ctx.web.log()[-2000:]
    if "fair_use" not in cfg["skip"]:
        lib.log("fair use under attack: bench/fair_use.py in its own process (with the limits on)")
        result["fair_use"] = fair_use.in_own_process(size=args.size)
    result["machine"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    result["total_seconds"] = round(time.time() - began, 1)
    rows = figures(result)
    result["figures"] = rows
    result["growth"] = growth(result)
    result["headline"] = headline.headline(result)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    md = markdown(result)
    (out / "summary.md").write_text(md)
    print()
    print(md)
    lib.log(f"written {out / 'summary.json'} and {out / 'summary.md'} in {result['total_seconds']} s")
    if out.resolve() == (ROOT / "bench" / "results").resolve():
        # The checkout's own summary is what docs/benchmarks.md's first table shows: rewritten with it,
        # by the docs' renderer in an environment without this one's settings (UNCAPPED, the database).
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNLEDGER_", "DJANGO_", "DATABASE_"))}
        writer = [sys.executable, str(ROOT / "docs" / "hooks" / "reference.py"), "--write"]
        subprocess.run(writer, cwd=ROOT, env=env, check=True)
    return 0


# --- the report ---------------------------------------------------------------------------------


def figures(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Each headline figure of tier x1 with its floor, ratio and target."""
    f, t = r["floor"], r["tiers"]["x1"]
    floor_read_rate = f["replay_rows"] / f["replay_100k_s"]
    rows: list[dict[str, Any]] = []

    def add(
        name: str,
        value: float,
        unit: str,
        floor: float | None,
        floor_what: str,
        target: float | None = None,
        rate: bool = False,
    ) -> None:
        ratio = None
        if floor:
            ratio = round((floor / value) if rate else (value / floor), 2)
        met = None
        if target is not None:
            met = value >= target if rate else value < target
        rows.append(
            {
                "figure": name,
                "value": value,
                "unit": unit,
                "floor": round(floor, 3) if floor else None,
                "floor_is": floor_what,
                "x_floor": ratio,
                "target": target,
                "met": met,
            }
        )

    lcw, notified = f["lock_check_write_ms"], f["txn_start_to_notified_ms"]
    rq = t.get("requests")
    if rq:
        # The headline's targets are its own (ratios); here each figure beside the raw floor.
        for key, what in (
            ("bare_uvicorn_ms", "uvicorn alone, no Django"),
            ("healthz_ms", "GET /healthz/ (no database)"),
            ("get_run_ms", "GET /api/runs/{id}/"),
            ("create_ahead_ms", "POST /api/runs/ scheduled ahead, workers live"),
            ("create_ms", "POST /api/runs/, workers paused"),
            ("cancel_queued_ms", "POST …/cancel/ of a queued run"),
            ("cancel_running_ms", "POST …/cancel/ of a running run"),
        ):
            for p in ("p50", "p99"):
                floor = lcw[p] if "cancel" in key or "create" in key else None
                add(f"one at a time: {what} {p}", rq[key][p], "ms", floor, f"lock-check-write {p}")
    # A cancel's committed answer stands beside the floor's lock-check-write, the worker's release
    # beside a transaction's NOTIFY reaching a listener: figure -> (floor, what it is, and its
    # name when measured again under the same load).
    cancel_floors = {
        "committed": ("lock_check_write_ms", "lock-check-write", "lock-check-write"),
        "released": ("txn_start_to_notified_ms", "txn → NOTIFY received", "txn → NOTIFY"),
    }
    for via in ("service", "http"):
        c = t[f"cancel_{via}"]
        for what, (floor, floor_is, _) in cancel_floors.items():
            for p in ("p50", "p99"):
                runs = f", {c['runs']} runs" if what == "committed" and p == "p50" else ""
                target = TARGETS[f"cancel_{what}_p99_ms"] if p == "p99" else None
                add(
                    f"cancel ({via}{runs}) → {what} {p}",
                    c[f"{what}_ms"][p],
                    "ms",
                    f[floor][p],
                    f"{floor_is} {p}",
                    target,
                )
    loaded = t["cancel_service"].get("floor_under_load")
    if loaded:
        c = t["cancel_service"]
        for what, (floor, _, loaded_is) in cancel_floors.items():
            add(
                f"cancel (service) → {what} p99, against the floor under the same load",
                c[f"{what}_ms"]["p99"],
                "ms",
                loaded[floor]["p99"],
                f"{loaded_is} p99 while the runs stream",
            )
    steps = t.get("step_kinds")
    if steps:
        # A cancel's release per kind of step, beside a transaction's NOTIFY reaching a listener
        # (plus the grace, for a thread: the worker waits that long for it by design).
        for row in step_kinds.rows(steps):
            alone = row["target_p99_ms"] is not None
            under = steps["under_load"].get("floor_under_load") if not alone else None
            wait = row["waits_by_design_ms"]
            add(
                f"cancel (service), {row['kind']} step, {row['setting']}: committed → released p99",
                row["p99"],
                "ms",
                wait + (under or f)["txn_start_to_notified_ms"]["p99"],
                (f"{wait:g} ms grace + " if wait else "")
                + "txn → NOTIFY p99"
                + (" while the runs stream" if under else ""),
                row["target_p99_ms"],
            )
    s = t["start"]
    for event, key, notifies, target in (
        (f"{EventType.RUN_STARTED} at an SSE watcher", "to_run_started_ms", 2, TARGETS["start_p50_ms"]),
        (f"first {EventType.OUTPUT_DELTA} at the watcher", "to_first_delta_ms", 3, None),
    ):
        add(
            f"start: create → {event} p50",
            s[key]["p50"],
            "ms",
            notifies * notified["p50"] + lcw["p50"],
            f"{notifies} x txn→NOTIFY + lock-check-write (p50)",
            target,
        )
    a1, am = t["append_one"], t["append_many"]
    add(
        f"append: one run, demo delay 0 ({a1['events_per_transaction']} ev/tx)",
        a1["committed_events_per_s"],
        "events/s",
        f["append_batch_100_ev_per_s"],
        "batched appends, 100/tx",
        rate=True,
    )
    add(
        f"append: {am['runs']} runs at once, 2 workers",
        am["committed_events_per_s"],
        "events/s",
        f["append_batch_100_ev_per_s"],
        "batched appends, 100/tx",
        rate=True,
    )
    if a1.get("delivered_live_events_per_s"):
        add(
            "stream: one SSE client of that live run",
            a1["delivered_live_events_per_s"],
            "events/s",
            None,
            "bounded by the append rate",
            rate=True,
        )
    so = t["stream_one"]
    add(
        f"stream: one SSE client, {so['events']:,} stored events",
        so["events_per_s"],
        "events/s",
        floor_read_rate,
        "read of 100k rows, pages of 1000",
        TARGETS["stream_one_client_events_per_s"],
        rate=True,
    )
    for n, w in t["watchers"].items():
        per_stream = (w["web_idle"]["rss_kb"] - w["web_before"]["rss_kb"]) / w["watchers"]
        add(
            f"{n} watchers: web-process memory per open stream",
            round(per_stream, 1),
            "kB",
            None,
            "",
            TARGETS["web_kb_per_stream"],
        )
        target = TARGETS["watchers_1000_p99_ms"] if n == "1000" else None
        add(f"{n} watchers: commit → delivery p50", w["delay_ms"]["p50"], "ms", notified["p50"], "txn → NOTIFY p50")
        add(
            f"{n} watchers: commit → delivery p99",
            w["delay_ms"]["p99"],
            "ms",
            notified["p99"],
            "txn → NOTIFY p99",
            target,
        )
    for name, value, unit, target, rate in client_stream.figures(t.get("client_stream")):
        add(
            name, value, unit, so["events_per_s"] if rate else None, "the same server, one raw SSE client", target, rate
        )
    rp = t["replay"]
    # The target is for 100k events; --quick replays fewer.
    full_replay = rp["events"] >= 100_000
    for how, key, target in (
        ("JSON pages of 1000", "json_pages_seconds", "replay_json_100k_s"),
        ("SSE", "sse_seconds", "replay_sse_100k_s"),
    ):
        floor = f["replay_100k_s"] * rp["events"] / f["replay_rows"]
        target_s = TARGETS[target] if full_replay else None
        add(f"replay {rp['events']:,} events: {how}", rp[key], "s", floor, "read in pages of 1000", target_s)
    return rows + model_stream.figure_rows(t.get("model_stream"), f)


GROWTH = [
    ("GET /healthz/ p50", lambda t: t["requests"]["healthz_ms"]["p50"], "ms"),
    ("GET a run p50", lambda t: t["requests"]["get_run_ms"]["p50"], "ms"),
    ("create scheduled ahead p50", lambda t: t["requests"]["create_ahead_ms"]["p50"], "ms"),
    ("cancel of a running run p50 (HTTP, one at a time)", lambda t: t["requests"]["cancel_running_ms"]["p50"], "ms"),
    ("cancel of a running run p99 (HTTP, one at a time)", lambda t: t["requests"]["cancel_running_ms"]["p99"], "ms"),
    ("cancel committed p99 (service)", lambda t: t["cancel_service"]["committed_ms"]["p99"], "ms"),
    ("cancel committed p99 (HTTP)", lambda t: t["cancel_http"]["committed_ms"]["p99"], "ms"),
    ("cancel released p99 (HTTP)", lambda t: t["cancel_http"]["released_ms"]["p99"], "ms"),
    ("start p50 (run.started)", lambda t: t["start"]["to_run_started_ms"]["p50"], "ms"),
    ("append one run", lambda t: t["append_one"]["committed_events_per_s"], "events/s"),
    ("append many runs", lambda t: t["append_many"]["committed_events_per_s"], "events/s"),
    ("stream one client", lambda t: t["stream_one"]["events_per_s"], "events/s"),
    ("100 watchers p99", lambda t: t["watchers"]["100"]["delay_ms"]["p99"], "ms"),
    ("replay JSON pages", lambda t: t["replay"]["json_pages_seconds"], "s"),
    ("replay SSE", lambda t: t["replay"]["sse_seconds"], "s"),
    # The machine, not the application: how the raw floor and the CPU use moved meanwhile.
    ("floor: lock-check-write p50", lambda t: round(t["floor"]["lock_check_write_ms"]["p50"], 2), "ms"),
    ("floor: replay 100k", lambda t: t["floor"]["replay_100k_s"], "s"),
    (
        "machine CPU busy during HTTP cancels",
        lambda t: t["cancel_http"]["cpu_during_cancels"]["machine_cpu_busy_pct"],
        "%",
    ),
]


def growth(r: dict[str, Any]) -> list[dict[str, Any]]:
    tiers = r["tiers"]
    rows = []
    for name, get, unit in GROWTH:
        row: dict[str, Any] = {"figure": name, "unit": unit}
        base = None
        for label, t in tiers.items():
            try:
                value = get(t)
            except (KeyError, IndexError):
                continue
            row[label] = value
            if base is None:
                base = value
            elif base:
                row[f"{label}_vs_x1"] = round(value / base, 2)
        rows.append(row)
    return rows


_fmt = headline.fmt


def markdown(r: dict[str, Any]) -> str:
    m = r["machine"]
    lines = [
        "## Headline",
        "",
        headline.markdown(r["headline"]).rstrip("\n"),
        "",
        "## Every figure",
        "",
        f"Measured {r['at'][:10]} at revision `{r['revision']}` ({r['mode']} sizes, {r['total_seconds']:.0f} s) on "
        f"{m['nproc']} x {m['cpu']}, {m['memory_gib']} GiB, PostgreSQL {m.get('postgresql', '?')} "
        f"(fsync {m.get('postgresql_fsync', '?')}, same machine), Python {m['python']}; "
        f"load average {m['load_average'][0]} at the start, {m['load_average_end'][0]} at the end "
        f"(CPU {m['cpu_busy_pct_before_start']}% busy before the run: other users of the machine). "
        "One uvicorn web process, two worker processes, default settings. "
        "“x floor”: how many times slower than raw psycopg doing the same work in the same run "
        "(`bench/floor.py`).",
        "",
        "Machine CPU busy (all processes, other users' included) during the cancels: "
        + ", ".join(
            f"{via} {r['tiers']['x1'][f'cancel_{via}']['cpu_during_cancels']['machine_cpu_busy_pct']}%"
            for via in ("service", "http")
        )
        + "; while 1000 watchers were fed: "
        + f"{r['tiers']['x1']['watchers'].get('1000', {}).get('cpu_while_writing', {}).get('machine_cpu_busy_pct', '?')}%.",
        "",
        "| figure | x floor | value | floor (raw psycopg, same run) | target | met |",
        "|---|---:|---:|---|---:|:-:|",
    ]
    for row in r["figures"]:
        unit = row["unit"]
        target = (
            ""
            if row["target"] is None
            else (f"≥ {_fmt(row['target'])}" if unit == "events/s" else f"< {_fmt(row['target'])}")
        )
        floor = "" if row["floor"] is None else f"{_fmt(row['floor'])} {unit} ({row['floor_is']})"
        lines.append(
            f"| {row['figure']} | {_fmt(row['x_floor'])} | {_fmt(row['value'])} {unit} | {floor} | "
            f"{target + ' ' + unit if target else ''} | {'' if row['met'] is None else _fmt(row['met'])} |"
        )
    steps = r["tiers"]["x1"].get("step_kinds")
    if steps:
        lines += ["", step_kinds.markdown(steps, r["floor"]).rstrip("\n")]
    if r.get("fair_use"):
        lines += ["", fair_use.markdown(r["fair_use"]).rstrip("\n")]
    tiers = [k for k in r["tiers"] if k != "x1"]
    if tiers:
        bg = {k: r["tiers"][k].get("background", {}) for k in tiers}
        heads = " | ".join(
            f"{k} ({bg[k].get('total_runs', 0):,} runs, {bg[k].get('total_events', 0):,} events)" for k in tiers
        )
        lines += [
            "",
            "Growth: the same figures with background rows (finished runs of another user, 10 events each) "
            "already in the database. The ratio is to tier x1.",
            "",
            f"| figure | x1 | {heads} |",
            "|---|---:|" + "---:|" * len(tiers),
        ]
        for row in r["growth"]:
            cells = [f"{_fmt(row.get(k))} ({_fmt(row.get(k + '_vs_x1'))}x)" for k in tiers]
            lines.append(f"| {row['figure']} ({row['unit']}) | {_fmt(row.get('x1'))} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
