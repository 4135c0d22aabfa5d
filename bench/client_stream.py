"""Benchmark: the Python client (clients/python) reading a run's stream, and resuming it after a cut.

    .venv/bin/python -m bench client_stream [--events 10000] [--cuts 200]

How it works: docs/benchmarks.md#method-client_stream.
"""

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.lib import RESULTS, Ctx, app_running, durable_cluster, machine_facts, postgres_facts, save_and_print, summary
from tests.support.procs import Procs
from tests.support.proxies import CuttableProxy

FULL = {"client_events": 10_000, "client_cuts": 200, "client_default_retry_cuts": 5}
QUICK = {**FULL, "client_cuts": 100, "client_default_retry_cuts": 3}
TARGET_EVENTS_PER_S = 20_000
CUT_AFTER_BYTES = 4000  # about 25 frames of the stored runs below


def measure(ctx: Ctx, *, events: int, cuts: int, default_retry_cuts: int) -> dict[str, Any]:
    from bench import scenarios as sc

    run = sc.make_running_run(ctx, events, label="client-stream")
    sc.complete(run)
    out: dict[str, Any] = {"events": events + 1}
    for name, read in (("sync", _read_sync), ("async", _read_async)):
        tries = sorted(read(ctx.base, ctx.token, str(run.pk), events + 1) for _ in range(3))
        out[name] = {"seconds": round(tries[1], 3), "events_per_s": round((events + 1) / tries[1])}
    raw = sorted(sc._stream_all(ctx, run, events + 1) for _ in range(3))[1]
    out["raw_socket_events_per_s"] = round((events + 1) / (raw[1][-1].received_at - raw[0]))
    out["parse_only_events_per_s"] = _parse_rate(ctx.base, ctx.token, str(run.pk), events + 1)

    # Enough stored events for `cuts` cuts, each connection carrying CUT_AFTER_BYTES.
    resumed = sc.make_running_run(ctx, cuts * 30, label="client-resume")
    sc.complete(resumed)
    logs = Path(tempfile.mkdtemp(prefix="runledger-bench-client-"))
    procs = Procs(logs)
    try:
        fast = procs.uvicorn(env={**os.environ, "RUNLEDGER_SSE_RETRY_MS": "0"}, timeout=60)
        out["resume_retry_0_ms"] = _resume_costs(fast.port, ctx.token, str(resumed.pk), cuts)
    finally:
        procs.stop_all(timeout=20)
        shutil.rmtree(logs, ignore_errors=True)
    out["resume_retry_default_ms"] = _resume_costs(ctx.web.port, ctx.token, str(resumed.pk), default_retry_cuts)
    return out


def _read_sync(url: str, token: str, run_id: str, expect: int) -> float:
    import runledger_client as rl

    with rl.Client(url, token) as client:
        began = time.perf_counter()
        got = sum(1 for _ in client.stream(run_id))
        seconds = time.perf_counter() - began
    assert got == expect, (got, expect)
    return seconds


def _read_async(url: str, token: str, run_id: str, expect: int) -> float:
    import runledger_client as rl

    async def read() -> float:
        async with rl.AsyncClient(url, token) as client:
            began = time.perf_counter()
            got = 0
            async for _ in client.stream(run_id):
                got += 1
            seconds = time.perf_counter() - began
        assert got == expect, (got, expect)
        return seconds

    return asyncio.run(read())


def _parse_rate(url: str, token: str, run_id: str, expect: int) -> int:
    """The client's own work per event: the stream's body, as httpx handed it over, fed to the
    shared StreamState again (no network, no server)."""
    import httpx

    from runledger_client import Retry
    from runledger_client._stream import StreamState

    with httpx.stream(
        "GET", f"{url}/api/runs/{run_id}/stream/", headers={"Authorization": f"Token {token}"}
    ) as response:
        chunks = list(response.iter_bytes())
    tries = []
    for _ in range(3):
        state = StreamState(run_id, 0, Retry())
        state.connect_headers()
        began = time.perf_counter()
        got = sum(len(state.feed(chunk)) for chunk in chunks)
        tries.append(time.perf_counter() - began)
    assert got == expect, (got, expect)
    return round(expect / sorted(tries)[1])


def _resume_costs(port: int | None, token: str, run_id: str, cuts: int) -> dict[str, float]:
    import runledger_client as rl

    proxy = CuttableProxy(upstream_port=int(port or 0)).start()
    proxy.cut_streams_after(lambda: CUT_AFTER_BYTES)
    arrived: dict[int, float] = {}
    try:
        with rl.Client(proxy.url, token) as client:
            for event in client.stream(run_id):
                arrived[event.seq] = time.monotonic()
                if proxy.cuts > cuts:
                    break
    finally:
        proxy.stop()
    requests = proxy.stream_requests()
    costs = []
    for i, cut_at in enumerate(proxy.cut_times[:cuts]):
        resumed_after = int(requests[i + 1].headers["last-event-id"])
        costs.append((arrived[resumed_after + 1] - cut_at) * 1000)
    return summary(costs)


def figures(result: dict[str, Any] | None) -> list[tuple[str, float, str, float | None, bool]]:
    """(figure, value, unit, target, is a rate) rows for run_all's table."""
    if not result:
        return []
    n = f"{result['events']:,}"
    fast, slow = result["resume_retry_0_ms"], result["resume_retry_default_ms"]
    return [
        (
            f"Python client: Client.stream, {n} stored events",
            result["sync"]["events_per_s"],
            "events/s",
            TARGET_EVENTS_PER_S,
            True,
        ),
        (
            f"Python client: AsyncClient.stream, {n} stored events",
            result["async"]["events_per_s"],
            "events/s",
            TARGET_EVENTS_PER_S,
            True,
        ),
        (
            f"Python client: parsing alone, {n} events (its CPU per event)",
            result["parse_only_events_per_s"],
            "events/s",
            None,
            True,
        ),
        (f"Python client: cut → first new event p50 ({fast['n']} cuts, retry: 0)", fast["p50"], "ms", None, False),
        (f"Python client: cut → first new event p99 ({fast['n']} cuts, retry: 0)", fast["p99"], "ms", None, False),
        (f"Python client: cut → first new event p50 ({slow['n']} cuts, retry: 2000)", slow["p50"], "ms", None, False),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=FULL["client_events"])
    parser.add_argument("--cuts", type=int, default=FULL["client_cuts"])
    parser.add_argument("--default-retry-cuts", type=int, default=FULL["client_default_retry_cuts"])
    parser.add_argument("--out", default=str(RESULTS / "client_stream.json"))
    args = parser.parse_args()
    machine = machine_facts()
    with durable_cluster() as cluster, app_running(cluster, workers=0) as ctx:
        machine.update(postgres_facts())
        result = measure(ctx, events=args.events, cuts=args.cuts, default_retry_cuts=args.default_retry_cuts)
    print(f"{'raw socket client (the server alone), same run':72} {result['raw_socket_events_per_s']:>10,} events/s")
    save_and_print("client_stream", machine, result, args.out, figures(result), "≥")
    return 0
