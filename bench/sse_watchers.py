"""Benchmark: many SSE watchers of one run on one uvicorn web process (or several).

    .venv/bin/python -m bench sse_watchers [--watchers 500] [--events 100] [--interval 0.1] [--web-processes 1]

How it works: docs/benchmarks.md#method-sse_watchers.
"""

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.lib import RESULTS, Sampler, bench_database, durable_cluster, percentile
from tests.support.procs import ROOT, Procs, group_members, proc_status
from tests.support.sse_writer import paced_command

WEB_APP_NAME = "bench-sse-web"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--watchers", type=int, default=500)
    parser.add_argument("--events", type=int, default=100)
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between the writer's commits")
    parser.add_argument("--web-processes", type=int, default=1, help="uvicorn --workers N")
    parser.add_argument("--database-url", help="an existing, empty PostgreSQL database instead of a new cluster")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

    with ExitStack() as stack:
        url = args.database_url or stack.enter_context(durable_cluster()).url
        logs = stack.enter_context(
            tempfile.TemporaryDirectory(prefix="runledger-bench-sse-", ignore_cleanup_errors=True)
        )
        procs = Procs(Path(logs))
        stack.callback(procs.stop_all, timeout=10)
        env, user, token = bench_database(url)
        from runs import services
        from runs.models import RunEvent
        from tests.support.db import connections_named, event_table_scans, listening
        from tests.support.sse import auth_headers, watch

        run = services.run_create(owner=user, agent="demo", input={"bench": True})
        claimed = services.run_claim(worker="bench")
        assert claimed is not None and claimed[0].pk == run.pk
        run = claimed[0]

        web = procs.uvicorn(
            env={**env, "DATABASE_URL": f"{url}?application_name={WEB_APP_NAME}"}, workers=args.web_processes
        )
        base = web.url

        def web_status() -> dict[str, int]:
            """RSS and threads of the web process, or summed over uvicorn's children."""
            pids = [web.pid] if args.web_processes == 1 else [p for p in group_members(web.pid) if p != web.pid]
            totals = {"rss_kb": 0, "threads": 0, "processes": 0}
            for pid in pids:
                with contextlib.suppress(FileNotFoundError):
                    status = proc_status(pid)
                    totals["rss_kb"] += status["rss_kb"]
                    totals["threads"] += status["threads"]
                    totals["processes"] += 1
            return totals

        def db_connections() -> int:
            return connections_named(WEB_APP_NAME)

        def listen_connections() -> int:
            return len(listening("web"))

        before = web_status()
        path = f"/api/runs/{run.pk}/stream/?after_seq=0"

        async def bench() -> dict[str, Any]:
            connected = [asyncio.Event() for _ in range(args.watchers)]
            # Connects in flight at once, as browsers arriving: all at once, thousands would wait
            # past the bound on a stream's checks and be refused with 503 (the storm protection).
            gate = asyncio.Semaphore(64)

            async def one(c: asyncio.Event) -> list[Any]:
                async with gate:
                    task = asyncio.create_task(watch(base, path, auth_headers(token), connected=c, timeout=600))
                    opened = asyncio.create_task(c.wait())
                    await asyncio.wait({task, opened}, return_when=asyncio.FIRST_COMPLETED)
                    opened.cancel()
                return await task

            t0 = time.monotonic()
            tasks = [asyncio.create_task(one(c)) for c in connected]
            await asyncio.wait_for(asyncio.gather(*(c.wait() for c in connected)), 300)
            connect_seconds = time.monotonic() - t0
            await asyncio.sleep(3)  # let the connect burst settle before measuring the idle state
            idle = {
                **web_status(),
                "db_connections": await asyncio.to_thread(db_connections),
                "listen_connections": await asyncio.to_thread(listen_connections),
            }
            scans_before = await asyncio.to_thread(event_table_scans)
            sampler = Sampler(web.pid, db_connections, interval=0.05, status=web_status)
            sampler.start()
            writer = await asyncio.create_subprocess_exec(
                *paced_command(run.pk, run.generation, count=args.events, interval=args.interval),
                cwd=ROOT,
                env=env,
                stdout=asyncio.subprocess.PIPE,
            )
            out, _ = await writer.communicate()
            gathered = await asyncio.gather(*tasks, return_exceptions=True)
            failures = [repr(r) for r in gathered if isinstance(r, BaseException)]
            results = [r for r in gathered if not isinstance(r, BaseException)]
            sampler.stop_event.set()
            sampler.join()
            await asyncio.sleep(1.5)  # PostgreSQL flushes table statistics within a second
            scans = await asyncio.to_thread(event_table_scans) - scans_before
            committed = {int(s): float(t) for s, t in (line.split() for line in out.decode().splitlines())}
            return {
                "results": results,
                "committed": committed,
                "idle": idle,
                "peak": sampler.peak,
                "scans": scans,
                "connect_seconds": connect_seconds,
                "failures": failures,
            }

        measured = asyncio.run(bench())
        stored = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
        complete = sum(1 for events in measured["results"] if [e.seq for e in events] == stored)
        delays = [
            e.received_at - measured["committed"][e.seq]
            for events in measured["results"]
            for e in events
            if e.seq in measured["committed"]
        ]
        report = {
            "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load": os.getloadavg()},
            "watchers": args.watchers,
            "web_processes": args.web_processes,
            "events": len(measured["committed"]),
            "interval_seconds": args.interval,
            "watchers_with_every_event_in_order": complete,
            "watcher_failures": measured["failures"][:10],
            "connect_all_seconds": round(measured["connect_seconds"], 2),
            "delay_seconds": {
                "p50": round(statistics.median(delays), 4),
                "p99": round(percentile(delays, 99), 4),
                "max": round(max(delays), 4),
                "samples": len(delays),
            },
            "web_process": {
                "before_watchers": before,
                "idle_with_watchers": measured["idle"],
                "peak_during_burst": measured["peak"],
            },
            "event_table_reads_during_burst": measured["scans"],
        }
        print_table(report)
        RESULTS.mkdir(parents=True, exist_ok=True)
        out_path = RESULTS / f"sse_watchers-{time.strftime('%Y%m%d-%H%M%S')}.json"
        out_path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nJSON: {out_path}")
        return 0 if complete == args.watchers else 1


def print_table(r: dict[str, Any]) -> None:
    d, w = r["delay_seconds"], r["web_process"]
    rows = [
        ("watchers (one run)", f"{r['watchers']} on {r['web_processes']} web process(es)"),
        ("events (one commit each, every)", f"{r['events']} ({r['interval_seconds']} s apart)"),
        ("watchers that got every event, in order", f"{r['watchers_with_every_event_in_order']}"),
        ("time to connect all watchers", f"{r['connect_all_seconds']} s"),
        ("commit -> delivery p50", f"{d['p50'] * 1000:.1f} ms"),
        ("commit -> delivery p99", f"{d['p99'] * 1000:.1f} ms"),
        ("commit -> delivery max", f"{d['max'] * 1000:.1f} ms"),
        ("web RSS before / idle / peak", _triple(w, "rss_kb", lambda v: f"{v / 1024:.0f} MB")),
        ("web threads before / idle / peak", _triple(w, "threads", str)),
        (
            "web DB connections idle / peak",
            f"{w['idle_with_watchers']['db_connections']} / {w['peak_during_burst']['db_connections']}"
            f" (+{w['idle_with_watchers']['listen_connections']} LISTEN)",
        ),
        ("event-table reads (scans) during the burst", f"{r['event_table_reads_during_burst']}"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def _triple(w: dict[str, Any], key: str, fmt: Any) -> str:
    return " / ".join(fmt(w[k][key]) for k in ("before_watchers", "idle_with_watchers", "peak_during_burst"))
