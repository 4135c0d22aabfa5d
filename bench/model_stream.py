"""Cancel → the model stream closed at the model server, for the `openai_chat` agent.

    .venv/bin/python -m bench model_stream [--cancels 40]

How it works: docs/benchmarks.md#method-model_stream.
"""

import argparse
import json
import os
import select
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.lib import (
    RESULTS,
    Ctx,
    app_running,
    durable_cluster,
    floor_option,
    machine_facts,
    percentile,
    run_floor,
    summary,
)
from tests.support.openai_server import ModelServer
from tests.support.procs import Procs
from tests.support.waiting import wait_until

MODEL = "bench+words-100000+slow-20ms"
# The default RUNLEDGER_CANCEL_GRACE_SECONDS: the stream must be closed within it.
TARGET_MS = 500


@contextmanager
def model_server() -> Iterator[ModelServer]:
    """The model server started, and this process's environment set so that every web and worker
    process started from now on loads `openai_chat` against it."""
    logs = Path(tempfile.mkdtemp(prefix="runledger-bench-model-"))
    procs = Procs(logs)
    saved = dict(os.environ)
    try:
        server = ModelServer(procs, logs)
        os.environ.update(server.settings())
        yield server
    finally:
        os.environ.clear()
        os.environ.update(saved)
        procs.stop_all()
        shutil.rmtree(logs, ignore_errors=True)


def _close_seen_ms(listener: socket.socket) -> float:
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    ready, seen = threading.Event(), [0.0]

    def watch() -> None:
        ready.set()
        select.select([server], [], [], 5)
        seen[0] = time.perf_counter()

    watcher = threading.Thread(target=watch)
    watcher.start()
    ready.wait()
    closed = time.perf_counter()
    client.close()
    watcher.join()
    server.close()
    return (seen[0] - closed) * 1000


def loopback_close_floor(samples: int = 200) -> dict[str, float]:
    """One end of a loopback TCP connection closed → the other end's select sees it, in ms."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        return summary([_close_seen_ms(listener) for _ in range(samples)])


def measure(ctx: Ctx, server: ModelServer, *, cancels: int) -> dict[str, Any]:
    from django.db import connection

    import runs.agents.openai_chat  # noqa: F401  (registers the agent in this process too)
    from runs import services
    from runs.events import EventType
    from runs.models import Run, RunAttempt, RunEvent

    def read(fn: Any) -> Any:
        try:
            return fn()
        finally:
            connection.close()

    committed_ms, closed_ms, released_ms, late_chunks = [], [], [], []
    for i in range(cancels):
        marker = f"bench run {i}"
        messages = [{"role": "user", "content": marker}]
        run = services.run_create(owner=ctx.user, agent="openai_chat", input={"model": MODEL, "messages": messages})
        wait_until(
            lambda run=run: read(RunEvent.objects.filter(run_id=run.pk, type=EventType.OUTPUT_DELTA).count) >= 3,
            timeout=60,
            what=f"{marker} streaming",
            interval=0.01,
        )
        (request,) = [r["request"] for r in server.requests() if r["body"]["messages"] == messages]
        t0 = time.time()
        services.run_cancel(run_id=run.pk, actor=ctx.user, note="bench")
        committed_ms.append((time.time() - t0) * 1000)
        gone = wait_until(lambda request=request: server.ended(request), timeout=30, what=f"{marker} closed")
        assert gone["event"] == "disconnect", gone
        attempt = wait_until(
            lambda run=run: read(RunAttempt.objects.filter(run_id=run.pk, released_at__isnull=False).first),
            timeout=30,
            what=f"{marker} released",
        )
        ended_at = read(lambda run=run: Run.objects.get(pk=run.pk).ended_at).timestamp()
        closed_ms.append((gone["at"] - ended_at) * 1000)
        released_ms.append((attempt.released_at.timestamp() - ended_at) * 1000)
        # Generated after the cancel committed (and so never stored): what the cancel still cost.
        late_chunks.append(sum(1 for c in server.records("chunk", request) if c["at"] > ended_at))
    return {
        "cancels": cancels,
        "model": MODEL,
        "committed_ms": summary(committed_ms),
        "closed_after_commit_ms": summary(closed_ms),
        "released_after_commit_ms": summary(released_ms),
        "chunks_sent_after_the_commit": {"p50": percentile(late_chunks, 50), "max": max(late_chunks)},
        "loopback_close_floor_ms": loopback_close_floor(),
    }


def figure_rows(m: dict[str, Any] | None, floor: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows for run_all's table: closed p50 / p99 against NOTIFY + loopback close."""
    if not m:
        return []
    rows = []
    for p in ("p50", "p99"):
        value = m["closed_after_commit_ms"][p]
        floor_ms = floor["txn_start_to_notified_ms"][p] + m["loopback_close_floor_ms"][p]
        rows.append(
            {
                "figure": f"model stream ({m['cancels']} cancels): cancel committed → closed at the server {p}",
                "value": value,
                "unit": "ms",
                "floor": round(floor_ms, 3),
                "floor_is": f"txn → NOTIFY + loopback close → EOF {p}",
                "x_floor": round(value / floor_ms, 2) if floor_ms else None,
                "target": TARGET_MS if p == "p99" else None,
                "met": value < TARGET_MS if p == "p99" else None,
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cancels", type=int, default=40, help="runs to cancel, one at a time")
    floor_option(parser)
    parser.add_argument("--out", default=str(RESULTS / "model_stream.json"))
    args = parser.parse_args()
    machine = machine_facts()
    with durable_cluster() as cluster, model_server() as server:
        floor = run_floor(cluster.create_database("floor"), *args.floor_args)
        with app_running(cluster, workers=1, concurrency=4) as ctx:
            result = measure(ctx, server, cancels=args.cancels)
    report = {"benchmark": "model_stream", "at": datetime.now(UTC).isoformat(), "machine": machine, **result}
    report["floor"] = floor
    report["figures"] = figure_rows(result, floor)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    for key in ("committed_ms", "closed_after_commit_ms", "released_after_commit_ms", "loopback_close_floor_ms"):
        s = result[key]
        print(f"{key:28} p50 {s['p50']:8.2f}  p99 {s['p99']:8.2f}  max {s['max']:8.2f}  (ms)")
    print(f"chunks sent after the commit: {result['chunks_sent_after_the_commit']}")
    for row in report["figures"]:
        print(f"{row['figure']}: {row['value']} ms, {row['x_floor']} x floor ({row['floor']} ms)")
    print(f"written to {out}")
    return 0
