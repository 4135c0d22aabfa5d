"""Bounded answers: what one user's big rows cost a web process's memory.

    .venv/bin/python -m bench bounded_answers [--runs 200] [--input-kb 255] [--parallel 6] [--events 200] [--event-kb 250]

How it works: docs/benchmarks.md#method-bounded_answers.
"""

import argparse
import http.client
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from bench.lib import RESULTS, Ctx, Http, app_running, durable_cluster, git_revision, log, machine_facts, sse_blocking
from tests.support.memory import memory_kb, reset_peak


def get_bytes(base: str, token: str, path: str) -> int:
    """The body size of one GET, read to its end on a connection of its own."""
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
    try:
        conn.request("GET", path, headers={"Authorization": f"Token {token}"})
        response = conn.getresponse()
        body = response.read()
        assert response.status == 200, (response.status, body[:300])
        return len(body)
    finally:
        conn.close()


def stream_bytes(base: str, token: str, path: str) -> int:
    _, chunks = sse_blocking(base, path, token, timeout=600)
    return sum(len(data) for _, data in chunks)


def measured(ctx: Ctx, parallel: int, fetch: Callable[[], int]) -> dict[str, Any]:
    """`parallel` calls of `fetch` at once, and the web process's memory around them."""
    pid = ctx.web.pid
    before = memory_kb(pid)["VmRSS"]
    reset_peak(pid)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        sizes = list(pool.map(lambda _: fetch(), range(parallel)))
    seconds = time.perf_counter() - t0
    after = memory_kb(pid)
    return {
        "answer_bytes": sizes,
        "seconds": round(seconds, 2),
        "rss_before_mb": round(before / 1024, 1),
        "rss_peak_mb": round(after["VmHWM"] / 1024, 1),
        "rss_after_mb": round(after["VmRSS"] / 1024, 1),
    }


def make_runs(ctx: Ctx, runs: int, input_kb: int) -> None:
    http = Http(ctx.base, ctx.token)
    try:
        for _ in range(runs):
            status, body = http.request(
                "POST", "/api/runs/", {"agent": "demo", "input": {"pad": "x" * input_kb * 1000}}
            )
            assert status == 201, (status, body)
            status, body = http.request("POST", f"/api/runs/{body['id']}/cancel/", {})
            assert status == 200, (status, body)
    finally:
        http.close()


def make_big_events_run(ctx: Ctx, events: int, event_kb: int) -> str:
    from runs import services
    from runs.events import EventType

    run = services.run_create(owner=ctx.user, agent="demo", input={})
    claimed = services.run_claim(worker="bench")
    assert claimed is not None and claimed[0].pk == run.pk
    generation = claimed[0].generation
    delta = (EventType.OUTPUT_DELTA, {"text": "y" * event_kb * 1000})
    for written in range(0, events, 10):
        services.run_events_append(run_id=run.pk, generation=generation, events=[delta] * min(10, events - written))
    services.run_complete(run_id=run.pk, generation=generation, output={"events": events})
    return str(run.pk)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--input-kb", type=int, default=255)
    parser.add_argument("--parallel", type=int, default=6)
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--event-kb", type=int, default=250)
    args = parser.parse_args()
    machine = machine_facts()
    report: dict[str, Any] = {"revision": git_revision(), "machine": machine, "args": vars(args)}
    with durable_cluster() as cluster, app_running(cluster, workers=0) as ctx:
        log(f"{args.runs} cancelled runs with {args.input_kb} kB inputs")
        make_runs(ctx, args.runs, args.input_kb)
        report["idle_rss_mb"] = round(memory_kb(ctx.web.pid)["VmRSS"] / 1024, 1)
        log(f"{args.parallel} parallel GET /api/runs/?page_size=500")
        report["run_list"] = measured(
            ctx, args.parallel, lambda: get_bytes(ctx.base, ctx.token, "/api/runs/?page_size=500")
        )
        log(f"a run with {args.events} events of {args.event_kb} kB")
        run_id = make_big_events_run(ctx, args.events, args.event_kb)
        log(f"{args.parallel} parallel GET /api/runs/<id>/events/?limit=1000")
        page = f"/api/runs/{run_id}/events/?limit=1000"
        report["events_page"] = measured(ctx, args.parallel, lambda: get_bytes(ctx.base, ctx.token, page))
        log(f"{args.parallel} parallel SSE replays from seq 0")
        stream = f"/api/runs/{run_id}/stream/?after_seq=0"
        report["stream_replay"] = measured(ctx, args.parallel, lambda: stream_bytes(ctx.base, ctx.token, stream))
    print(
        f"machine: {machine['nproc']} cores, {machine['cpu']}; web process idle after setup: {report['idle_rss_mb']} MB"
    )
    print(f"{'phase':<14} {'largest answer':>15} {'RSS before':>11} {'peak':>9} {'after':>9} {'seconds':>8}")
    for phase in ("run_list", "events_page", "stream_replay"):
        row = report[phase]
        print(
            f"{phase:<14} {max(row['answer_bytes']) / 1e6:>12.2f} MB {row['rss_before_mb']:>8.1f} MB"
            f" {row['rss_peak_mb']:>6.1f} MB {row['rss_after_mb']:>6.1f} MB {row['seconds']:>8.2f}"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"bounded_answers-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {out}")
    return 0
