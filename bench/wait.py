"""Benchmark: the server-side wait (`GET /api/runs/{id}/wait/`) of many clients on one run.

    .venv/bin/python -m bench wait [--waiters 200] [--rounds 5]

Without run_all it starts its own throwaway durable cluster and one web process (no worker: the
run is written directly, bench.scenarios.make_running_run). Each round, `--waiters` clients (raw
sockets, one connection each) wait on one running run; once the web process has taken them all
(a later wait of the same run, with a short timeout, answered `timeout`), the web process's threads
and PostgreSQL connections are counted, then the run is completed through the services. Measured:
from the terminal commit (the service's return, in this process) to each client having the whole
answer, `wait_result` `ended` — p50/p99 over every waiter of every round.
"""

import argparse
import asyncio
import os
import time
from typing import Any

from bench import lib
from tests.support.procs import threads_of
from tests.support.sse import Stream, auth_headers

FULL = {"wait_waiters": 200, "wait_rounds": 5}
QUICK = {**FULL, "wait_rounds": 2}
TARGET_P99_MS = 50.0


def measure(ctx: lib.Ctx, *, waiters: int, rounds: int) -> dict[str, Any]:
    delays: list[float] = []
    held: list[dict[str, int]] = []
    by_round = []
    for _ in range(rounds):
        round_delays, facts = asyncio.run(_round(ctx, waiters))
        delays += round_delays
        held.append(facts)
        by_round.append(
            {
                **lib.summary(round_delays),
                "first": round(min(round_delays), 2),
                "load_1min": round(os.getloadavg()[0], 1),
            }
        )
    return {
        "waiters": waiters,
        "rounds": rounds,
        "commit_to_answer_ms": lib.summary(delays),
        "by_round": by_round,
        "web_threads_while_waiting": max(h["threads"] for h in held),
        "web_threads_before": min(h["threads_before"] for h in held),
        "web_connections_while_waiting": max(h["connections"] for h in held),
    }


async def _round(ctx: lib.Ctx, waiters: int) -> tuple[list[float], dict[str, int]]:
    from bench import scenarios as sc

    run = await asyncio.to_thread(sc.make_running_run, ctx, 0, "wait")
    path = f"/api/runs/{run.pk}/wait/?timeout=55"
    headers = auth_headers(ctx.token)
    facts = {"threads_before": threads_of(ctx.web.popen.pid)}
    arrived: list[float] = []

    async def answered(stream: Stream) -> Stream:
        await stream.open(timeout=60)
        arrived.append(time.monotonic())
        return stream

    streams = [Stream(ctx.base, path, headers) for _ in range(waiters)]
    await asyncio.gather(*(stream.send() for stream in streams))
    tasks = [asyncio.create_task(answered(stream)) for stream in streams]
    # Sent after every other: its check comes after theirs, on the same few opening threads.
    probe = await Stream(ctx.base, f"/api/runs/{run.pk}/wait/?timeout=0.05", headers).open(timeout=60)
    assert probe.json()["wait_result"] == "timeout", probe.body
    assert not arrived, "a wait answered before the run ended"
    facts["threads"] = threads_of(ctx.web.popen.pid)
    facts["connections"] = await asyncio.to_thread(_web_connections)
    committed = await asyncio.to_thread(_complete, run)
    answers = await asyncio.gather(*tasks)
    assert all(answer.json()["wait_result"] == "ended" for answer in answers)
    return [(at - committed) * 1000 for at in arrived], facts


def _complete(run: Any) -> float:
    from bench import scenarios as sc

    sc.complete(run)
    return time.monotonic()


def _web_connections() -> int:
    from django.db import connection

    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [lib.WEB_APP_NAME])
            return int(cursor.fetchone()[0])
    finally:
        connection.close()


def figures(result: dict[str, Any] | None) -> list[tuple[str, float, str, float | None, bool]]:
    """(figure, value, unit, target, is a rate) rows for run_all's table."""
    if not result:
        return []
    delays, n = result["commit_to_answer_ms"], result["waiters"]
    return [
        (f"Server-side wait: terminal commit → answer p50 ({n} waiters of one run)", delays["p50"], "ms", None, False),
        (
            f"Server-side wait: terminal commit → answer p99 ({n} waiters of one run)",
            delays["p99"],
            "ms",
            TARGET_P99_MS,
            False,
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--waiters", type=int, default=FULL["wait_waiters"])
    parser.add_argument("--rounds", type=int, default=FULL["wait_rounds"])
    parser.add_argument("--out", default=str(lib.RESULTS / "wait.json"))
    args = parser.parse_args()
    machine = lib.machine_facts()
    with lib.durable_cluster() as cluster, lib.app_running(cluster, workers=0) as ctx:
        machine.update(lib.postgres_facts())
        result = measure(ctx, waiters=args.waiters, rounds=args.rounds)
    lib.save_and_print("wait", machine, result, args.out, figures(result), "≤")
    return 0
