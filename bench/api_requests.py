"""One request at a time over HTTP: what a user waits for on each endpoint.

    .venv/bin/python -m bench api_requests [--samples 300]   (also a phase of bench/run_all.py)

Measured on a kept-alive connection, one request after the other: `POST /api/runs/` of a run
scheduled an hour ahead with the workers live; then, with the workers paused (SIGSTOP) so that
nothing else runs: `GET /healthz/`, `GET /api/runs/{id}/`, `POST /api/runs/`, `POST …/cancel/` of a
queued run and of a running one. How: docs/benchmarks.md#method-api_requests.
Import only after `django.setup()`.
"""

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.lib import Ctx, Http, app_running, durable_cluster, run_floor, summary
from tests.support.procs import Procs, free_port, wait_http_ok


@contextmanager
def workers_paused(ctx: Ctx) -> Iterator[None]:
    for worker in ctx.workers:
        os.kill(worker.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for worker in ctx.workers:
            os.kill(worker.pid, signal.SIGCONT)


def _timed(samples: int, call: Callable[[int], tuple[int, Any]], expect: int) -> dict[str, float]:
    ms: list[float] = []
    for i in range(samples):
        t0 = time.perf_counter()
        status, body = call(i)
        ms.append((time.perf_counter() - t0) * 1000)
        assert status == expect, (status, body)
    return summary(ms)


def bare_uvicorn(samples: int) -> dict[str, float]:
    """The same request loop against uvicorn alone (no Django): where the HTTP layer's time ends."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="runledger-bench-hello-") as logs:
        procs = Procs(Path(logs))
        try:
            port = free_port()
            args = [sys.executable, "-m", "uvicorn", "bench.hello_asgi:app", "--port", str(port), "--no-access-log"]
            proc = procs.start("uvicorn-hello", args, dict(os.environ), port=port)
            wait_http_ok(proc, "/")
            http = Http(proc.url, "")
            try:
                return _timed(samples, lambda _: http.request("GET", "/"), 200)
            finally:
                http.close()
        finally:
            procs.stop_all()


def measure(ctx: Ctx, *, samples: int, bare: bool = True) -> dict[str, Any]:
    """Each request `samples` times; with `bare`, uvicorn alone too (a process of its own)."""
    from bench.scenarios import make_running_run  # after django.setup()

    alone = bare_uvicorn(samples) if bare else None
    http = Http(ctx.base, ctx.token)
    warm = 20

    def creates(body: dict[str, Any], into: list[str]) -> Callable[[int], tuple[int, Any]]:
        def create(_: int) -> tuple[int, Any]:
            status, answer = http.request("POST", "/api/runs/", body)
            into.append(answer["id"])
            return status, answer

        return create

    def cancel(runs: list[str]) -> Callable[[int], tuple[int, Any]]:
        return lambda i: http.request("POST", f"/api/runs/{runs[i]}/cancel/", {})

    try:
        for _ in range(warm):  # the pool's connections, the first imports and caches
            http.request("GET", "/healthz/")
        # Not due for an hour: no worker has it to start, so the figure is the create's own
        # (the workers run, as they would beside any create).
        ahead: list[str] = []
        later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
        body = {"agent": "demo", "input": {"deltas": 1}, "start_after": later}
        create_ahead = _timed(samples, creates(body, ahead), 201)
        with workers_paused(ctx):
            healthz = _timed(samples, lambda _: http.request("GET", "/healthz/"), 200)
            created: list[str] = []
            create_ms = _timed(samples, creates({"agent": "demo", "input": {"deltas": 1}}, created), 201)
            one = created[0]
            get_ms = _timed(samples, lambda _: http.request("GET", f"/api/runs/{one}/"), 200)
            cancel_queued = _timed(samples, cancel(created), 200)
            running = [make_running_run(ctx, label="requests").pk for _ in range(samples)]
            cancel_running = _timed(samples, cancel(running), 200)
        # Not left queued for a later phase's claims to step over.
        _timed(samples, cancel(ahead), 200)
    finally:
        http.close()
    return {
        "samples": samples,
        **({"bare_uvicorn_ms": alone} if alone else {}),
        "healthz_ms": healthz,
        "get_run_ms": get_ms,
        "create_ms": create_ms,
        "create_ahead_ms": create_ahead,
        "cancel_queued_ms": cancel_queued,
        "cancel_running_ms": cancel_running,
    }


def main() -> int:
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--no-floor", action="store_true", help="skip bench/floor.py (about 2 minutes)")
    args = parser.parse_args()
    with durable_cluster() as cluster:
        floor = {} if args.no_floor else run_floor(cluster.create_database("floor"))
        with app_running(cluster, workers=1, concurrency=4) as ctx:
            result = measure(ctx, samples=args.samples)
    print(json.dumps({"floor_lock_check_write_ms": floor.get("lock_check_write_ms"), **result}))
    return 0
