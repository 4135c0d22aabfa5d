"""One request at a time over HTTP: what a user waits for on each endpoint.

    .venv/bin/python -m bench api_requests [--samples 300]   (also a phase of bench/run_all.py)

Measured on a kept-alive connection, one request after the other, with the workers paused
(SIGSTOP) so that created runs stay queued and nothing else runs meanwhile:
`GET /healthz/` (no database), `GET /api/runs/{id}/`, `POST /api/runs/`, `POST …/cancel/` of a
queued run, and of a running run whose attempt this benchmark holds (the run is `running` with a
live lease, as a worker's would be, so the cancel writes what a real one does).
Import only after `django.setup()`.
"""

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


def measure(ctx: Ctx, *, samples: int) -> dict[str, Any]:
    from bench.scenarios import make_running_run  # after django.setup()

    bare = bare_uvicorn(samples)
    http = Http(ctx.base, ctx.token)
    warm = 20
    try:
        with workers_paused(ctx):
            for _ in range(warm):  # the pool's connections, the first imports and caches
                http.request("GET", "/healthz/")
            healthz = _timed(samples, lambda _: http.request("GET", "/healthz/"), 200)
            created: list[str] = []

            def create(_: int) -> tuple[int, Any]:
                status, body = http.request("POST", "/api/runs/", {"agent": "demo", "input": {"deltas": 1}})
                created.append(body["id"])
                return status, body

            create_ms = _timed(samples, create, 201)
            one = created[0]
            get_ms = _timed(samples, lambda _: http.request("GET", f"/api/runs/{one}/"), 200)
            cancel_queued = _timed(samples, lambda i: http.request("POST", f"/api/runs/{created[i]}/cancel/", {}), 200)
            running = [make_running_run(ctx, label="requests").pk for _ in range(samples)]
            cancel_running = _timed(samples, lambda i: http.request("POST", f"/api/runs/{running[i]}/cancel/", {}), 200)
    finally:
        http.close()
    return {
        "samples": samples,
        "bare_uvicorn_ms": bare,
        "healthz_ms": healthz,
        "get_run_ms": get_ms,
        "create_ms": create_ms,
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
