"""Fair use under attack: ten users try to take everything while an eleventh streams.

    .venv/bin/python -m bench fair_use [--quick | --size smoke] [--running-cap N]

How it works: docs/benchmarks.md#method-fair_use.
"""

import argparse
import asyncio
import json
import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from bench.lib import (
    RESULTS,
    ROOT,
    CpuMeter,
    Ctx,
    Http,
    app_running,
    bench_command,
    durable_cluster,
    git_revision,
    log,
    machine_facts,
    parse_sse,
    postgres_facts,
    sse_blocking,
    summary,
)
from tests.support.procs import connections_to
from tests.support.sse import Event, Stream, auth_headers

# The fair-use limits this benchmark runs with: the defaults of config/settings.py, written out
# because bench/lib.py sets them to 0 for every other benchmark (and so that the report names them).
LIMITS = {
    "RUNLEDGER_MAX_STREAMS_PER_USER": "20",
    "RUNLEDGER_SSE_MAX_SECONDS": "300",
    "RUNLEDGER_DEFAULT_MAX_EVENTS": "100000",
    "RUNLEDGER_DEFAULT_MAX_STEPS": "10000",
    "RUNLEDGER_DEFAULT_DEADLINE_SECONDS": "86400",
    "RUNLEDGER_MAX_RUNNING_PER_USER": "0",
    "RUNLEDGER_WORKER_NEWCOMER_SLOTS": "1",
}
FULL = {"active_cap": 200, "alice_runs": 10, "hostile_users": 10, "hostile_streams": 40}
QUICK = {**FULL, "active_cap": 50, "alice_runs": 5}
# Every phase once, at the least that still reaches each limit (the CI's smoke run: figures mean nothing).
SMOKE = {"active_cap": 4, "alice_runs": 1, "hostile_users": 2, "hostile_streams": 3}
SIZES = {"full": FULL, "quick": QUICK, "smoke": SMOKE}
WORKERS, CONCURRENCY = 2, 8

ALICE = {"deltas": 100, "delay_ms": 20}
WRITER = {"deltas": 100_000, "delay_ms": 0}
HOLDER = {"deltas": 100_000, "delay_ms": 60_000}
# Over a bound: the demo's check_input (400), and a body over RUNLEDGER_MAX_BODY_BYTES (413).
OVER_BOUND = [{"deltas": 100_000_000}, {"children": 300}, {"deltas": 1, "pad": "x" * 300_000}]


# --- alice --------------------------------------------------------------------------------------


def alice(base: str, token: str, runs: int) -> dict[str, Any]:
    """`runs` demo runs one after another, each streamed from seq 0 right after its create."""
    http = Http(base, token)
    create_ms, claimed_ms, started_ms, delta_ms, delivery_ms, sound = [], [], [], [], [], 0
    try:
        for _ in range(runs):
            t0 = time.time()
            status, body = http.request("POST", "/api/runs/", {"agent": "demo", "input": ALICE})
            assert status == 201, (status, body)
            create_ms.append((time.time() - t0) * 1000)
            _, chunks = sse_blocking(base, f"/api/runs/{body['id']}/stream/?after_seq=0", token, timeout=600)
            events = parse_sse(chunks)
            first = {e.event: e for e in reversed(events)}
            claimed_ms.append((_written(first["run.started"]) - t0) * 1000)
            started_ms.append((first["run.started"].received_at - t0) * 1000)
            delta_ms.append((first["output.delta"].received_at - t0) * 1000)
            delivery_ms += [(e.received_at - _written(e)) * 1000 for e in events]
            in_order = [e.seq for e in events] == list(range(1, len(events) + 1))
            sound += in_order and events[-1].event == "run.completed"
    finally:
        http.close()
    return {
        "runs": runs,
        "runs_every_event_once_in_order_to_terminal": sound,
        "create_response_ms": summary(create_ms),
        "to_run_started_written_ms": summary(claimed_ms),
        "to_run_started_ms": summary(started_ms),
        "to_first_delta_ms": summary(delta_ms),
        "delivery_ms": summary(delivery_ms),
    }


def _written(e: Event) -> float:
    """When the worker wrote the event: its `created_at`, taken in the appending transaction."""
    return datetime.fromisoformat(e.json()["created_at"]).timestamp()


# --- the hostile users --------------------------------------------------------------------------


@dataclass
class Hostile:
    name: str
    token: str
    writers_first: bool
    cap: int
    answers: dict[int, int] = field(default_factory=dict)
    streams_opened: int = 0
    streams_refused: int = 0
    streams_held_most: int = 0
    mb_drained: float = 0.0
    writer_runs: list[str] = field(default_factory=list)
    refused_once: threading.Event = field(default_factory=threading.Event)
    streams_ready: threading.Event = field(default_factory=threading.Event)

    def report(self) -> dict[str, Any]:
        return {
            "writers_first": self.writers_first,
            "answers": {str(k): v for k, v in sorted(self.answers.items())},
            **{k: getattr(self, k) for k in ("streams_opened", "streams_refused", "streams_held_most")},
            "mb_drained": round(self.mb_drained, 1),
        }

    def input(self, k: int) -> dict[str, int]:
        """The k-th create's input: half of the cap one kind, then the other."""
        return WRITER if (k < self.cap // 2) == self.writers_first else HOLDER

    def create(self, base: str, stop: threading.Event) -> None:
        """(a) and (b): creates as fast as it can until refused, then once a second."""
        http = Http(base, self.token)
        created = 0
        for i in range(1_000_000):
            if stop.is_set():
                break
            body = OVER_BOUND[i // 5 % 3] if i % 5 == 4 else self.input(created)
            try:
                status, answer = http.request("POST", "/api/runs/", {"agent": "demo", "input": body})
            except OSError:
                status = 0  # a refused large body may cut the connection: counted as 0
                http.close()
            self.answers[status] = self.answers.get(status, 0) + 1
            if status == 201:
                created += 1
                if body is WRITER:
                    self.writer_runs.append(answer["id"])
            elif status == 429:
                self.refused_once.set()
                stop.wait(1)  # a hostile client's retry interval (it ignores Retry-After's 10 s)
        http.close()

    async def streams(self, base: str, most: int) -> None:
        """(c): streams opened one after another on its fast writers until refused or `most`."""
        while not self.writer_runs:
            await asyncio.sleep(0.05)  # its first writer is not created yet
        held: list[asyncio.Task[None]] = []
        try:
            for _ in range(most):
                stream = await Stream(base, self._path(0), auth_headers(self.token)).open(timeout=60)
                if stream.status != 200:
                    self.streams_refused += stream.status == 429
                    break
                self.streams_opened += 1
                held.append(asyncio.create_task(self._drain(base, stream)))
            self.streams_held_most = len(held)
        finally:
            self.streams_ready.set()
        await asyncio.gather(*held)

    def _path(self, i: int) -> str:
        return f"/api/runs/{self.writer_runs[i]}/stream/?after_seq=0"

    async def _drain(self, base: str, stream: Stream) -> None:
        i = 0
        while True:
            try:
                async for data in stream.chunks():
                    self.mb_drained += len(data) / 1e6
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                stream.close()
            i += 1
            while i >= len(self.writer_runs):
                await asyncio.sleep(1)  # no next writer yet
            stream = await Stream(base, self._path(i), auth_headers(self.token)).open(timeout=60)
            self.streams_opened += stream.status == 200
            self.streams_refused += stream.status == 429
            if stream.status != 200:
                return


class Load:
    """The hostile users' threads and their streams' event loop, all stopped on the way out."""

    def __init__(self, base: str, users: list[Hostile], streams: int) -> None:
        self.users = users
        self.stop = threading.Event()
        self.pool = ThreadPoolExecutor(len(users))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.creates = [self.pool.submit(u.create, base, self.stop) for u in users]
        self.tasks = [asyncio.run_coroutine_threadsafe(u.streams(base, streams), self.loop) for u in users]

    def close(self) -> None:
        self.stop.set()
        for task in self.tasks:
            task.cancel()
        self.pool.shutdown(wait=True, cancel_futures=True)

        async def cancel_all() -> None:
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        with suppress(Exception):
            asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        errors = [repr(f.exception()) for f in self.creates + self.tasks if f.done() and not f.cancelled()]
        self.errors = [e for e in errors if e != "None"]


# --- the database, sampled ----------------------------------------------------------------------


def db_state(hostile_ids: list[int]) -> dict[str, Any]:
    from django.db import connection
    from django.db.models import Count, Sum

    from runs.models import Run
    from runs.transitions import Status

    try:
        running = Run.objects.filter(status=Status.RUNNING).values_list("owner__username").annotate(n=Count("id"))
        return {
            "at": time.time(),
            "queued": Run.objects.filter(status=Status.QUEUED).count(),
            "running_per_owner": dict(sorted(running)),
            "hostile_events": Run.objects.filter(owner_id__in=hostile_ids).aggregate(n=Sum("last_seq"))["n"] or 0,
        }
    finally:
        connection.close()


class DbSampler(threading.Thread):
    def __init__(self, hostile_ids: list[int]) -> None:
        super().__init__(daemon=True)
        self.hostile_ids = hostile_ids
        self.stop_event = threading.Event()
        self.samples: list[dict[str, Any]] = []

    def run(self) -> None:
        while not self.stop_event.wait(1):
            self.samples.append(db_state(self.hostile_ids))

    def result(self) -> dict[str, Any]:
        self.stop_event.set()
        self.join()
        first, last = self.samples[0], self.samples[-1]
        return {
            "samples": len(self.samples),
            "queued_most": max(s["queued"] for s in self.samples),
            "running_most": max(sum(s["running_per_owner"].values()) for s in self.samples),
            "running_per_owner_at_end": last["running_per_owner"],
            "hostile_events_per_s": round(
                (last["hostile_events"] - first["hostile_events"]) / max(last["at"] - first["at"], 1)
            ),
        }


# --- the benchmark ------------------------------------------------------------------------------


def make_user(name: str) -> tuple[int, str]:
    from django.contrib.auth.models import User
    from django.db import connection

    from tests.support.db import token_for

    user = User.objects.create_user(name, password=f"{name}-password")
    token = token_for(user)
    connection.close()
    return user.pk, token


def measure(ctx: Ctx, cfg: dict[str, Any]) -> dict[str, Any]:
    pids = {"web": ctx.web.pid, **{w.name: w.pid for w in ctx.workers}, "this client": os.getpid()}
    _, alice_token = make_user("alice")
    log(f"alice unloaded: {cfg['alice_runs']} runs")
    cpu = CpuMeter(pids)
    unloaded = {**alice(ctx.base, alice_token, cfg["alice_runs"]), "cpu": cpu.stop()}

    users = []
    for i in range(cfg["hostile_users"]):
        pk, token = make_user(f"hostile-{i}")
        users.append((pk, Hostile(f"hostile-{i}", token, writers_first=i % 2 == 0, cap=cfg["active_cap"])))
    ids = [pk for pk, _ in users]
    log(f"{len(users)} hostile users: creating, streaming")
    t0 = time.time()
    load = Load(ctx.base, [h for _, h in users], cfg["hostile_streams"])
    try:
        deadline = time.time() + 300
        while time.time() < deadline:
            ready = all(h.refused_once.is_set() and h.streams_ready.is_set() for _, h in users)
            if ready and len(db_state(ids)["running_per_owner"]) >= len(users):
                break
            time.sleep(0.5)  # polling the load's progress; the deadline above bounds it
        full_blast = {
            "seconds_to_reach": round(time.time() - t0, 1),
            **db_state(ids),
            "web_connections": connections_to(ctx.web.port or 0),
        }
        log(f"full blast after {full_blast['seconds_to_reach']} s; alice loaded: {cfg['alice_runs']} runs")
        sampler = DbSampler(ids)
        sampler.start()
        cpu = CpuMeter(pids)
        loaded = {**alice(ctx.base, alice_token, cfg["alice_runs"]), "cpu": cpu.stop(), "database": sampler.result()}
    finally:
        load.close()
    return {
        "unloaded": unloaded,
        "loaded": loaded,
        "full_blast": full_blast,
        "hostile": {h.name: h.report() for _, h in users},
        "hostile_errors": load.errors,
    }


def in_own_process(*, size: str) -> dict[str, Any]:
    """For bench/run_all.py: this benchmark in a child process of its own (its processes need the
    limits that every other benchmark runs without), and its results."""
    subprocess.run(bench_command("fair_use", "--size", size), cwd=ROOT, check=True)
    return dict(json.loads((RESULTS / "fair_use.json").read_text()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--quick", action="store_const", const="quick", dest="size", default="full", help="50 active runs per user"
    )
    size.add_argument("--size", choices=SIZES, default="full", help="full, quick, or smoke (the least of each)")
    parser.add_argument("--running-cap", type=int, default=0, metavar="N", help="RUNLEDGER_MAX_RUNNING_PER_USER")
    args = parser.parse_args()
    cfg = SIZES[args.size]
    limits = {
        **LIMITS,
        "RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER": str(cfg["active_cap"]),
        "RUNLEDGER_MAX_RUNNING_PER_USER": str(args.running_cap),
    }
    result: dict[str, Any] = {
        "benchmark": "fair_use",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "revision": git_revision(),
        "mode": args.size,
        "config": {**cfg, "workers": WORKERS, "concurrency": CONCURRENCY, "alice_input": ALICE},
        "limits": limits,
        "machine": machine_facts(idle_seconds=0.2 if args.size == "smoke" else 3),
    }
    began = time.time()
    with (
        durable_cluster() as cluster,
        app_running(cluster, workers=WORKERS, concurrency=CONCURRENCY, env=limits) as ctx,
    ):
        result["machine"].update(postgres_facts())
        result.update(measure(ctx, cfg))
    result["machine"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    result["total_seconds"] = round(time.time() - began, 1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fair_use.json").write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    log(f"written {RESULTS / 'fair_use.json'} in {result['total_seconds']} s")
    return 0


# --- the report ---------------------------------------------------------------------------------


def _p(s: dict[str, Any], *keys: str) -> str:
    return " / ".join(f"{s[k]:,.1f}" for k in keys) if s.get("n") else "—"


def markdown(r: dict[str, Any]) -> str:
    u, lo, fb = r["unloaded"], r["loaded"], r["full_blast"]
    rows = [
        ("create → 201, p50 / p99 ms", "create_response_ms", ("p50", "p99")),
        ("create → `run.started` written (claimed), p50 / p99 ms", "to_run_started_written_ms", ("p50", "p99")),
        ("create → `run.started` received, p50 / p99 ms", "to_run_started_ms", ("p50", "p99")),
        ("create → first `output.delta`, p50 / p99 ms", "to_first_delta_ms", ("p50", "p99")),
        ("delivery (received - created_at), p50 / p99 / max ms", "delivery_ms", ("p50", "p99", "max")),
    ]
    lines = [
        f"Fair use under attack ({r['mode']}, {r['at']}, {r['revision']}): "
        f"{r['config']['hostile_users']} hostile users, alice's {r['config']['alice_runs']} runs of "
        f"{json.dumps(r['config']['alice_input'])} one after another.",
        "Limits: " + ", ".join(f"{k.removeprefix('RUNLEDGER_')}={v}" for k, v in r["limits"].items()) + ".",
        "",
        "| alice | unloaded | under attack |",
        "|---|---:|---:|",
        *(f"| {label} | {_p(u[key], *ks)} | {_p(lo[key], *ks)} |" for label, key, ks in rows),
        "| runs with every event once, in order, to the terminal | "
        f"{u['runs_every_event_once_in_order_to_terminal']}/{u['runs']} | "
        f"{lo['runs_every_event_once_in_order_to_terminal']}/{lo['runs']} |",
        f"| CPU: machine busy % | {u['cpu']['machine_cpu_busy_pct']} | {lo['cpu']['machine_cpu_busy_pct']} |",
        *(
            f"| CPU: {name} (cores) | {u['cpu']['process_cores'][name]} | {lo['cpu']['process_cores'][name]} |"
            for name in u["cpu"]["process_cores"]
        ),
        "",
        "| hostile user | 201 | 429 | 400 | 413 | streams opened / refused (held at most) | MB drained |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    hostile = list(r["hostile"].items())
    total = {
        "answers": {c: sum(h["answers"].get(c, 0) for _, h in hostile) for c in ("201", "429", "400", "413")},
        **{k: sum(h[k] for _, h in hostile) for k in ("streams_opened", "streams_refused", "streams_held_most")},
        "mb_drained": sum(h["mb_drained"] for _, h in hostile),
    }
    kinds = {True: " (writers first)", False: " (holders first)", None: ""}
    for name, h in [*hostile, ("all", {**total, "writers_first": None})]:
        a = h["answers"]
        lines.append(
            f"| {name}{kinds[h['writers_first']]} | {a.get('201', 0)} | {a.get('429', 0)} | {a.get('400', 0)} | "
            f"{a.get('413', 0)} | {h['streams_opened']} / {h['streams_refused']} ({h['streams_held_most']}) | "
            f"{h['mb_drained']:,.1f} |"
        )
    db = lo["database"]
    m = r["machine"]
    lines += [
        "",
        f"Full blast after {fb['seconds_to_reach']} s: {fb['queued']} runs queued, running per owner "
        f"{fb['running_per_owner']}, {fb['web_connections']} connections to the web process. During alice's "
        f"loaded runs: at most {db['queued_most']} queued and {db['running_most']} running; the hostile runs "
        f"committed {db['hostile_events_per_s']:,} events/s; running per owner at the end "
        f"{db['running_per_owner_at_end']}.",
        f"Machine: {m['nproc']} x {m['cpu']}, {m['memory_gib']} GiB, PostgreSQL {m.get('postgresql')} "
        f"(fsync {m.get('postgresql_fsync')}), Python {m['python']}; CPU {m['cpu_busy_pct_before_start']} % busy "
        f"before the start, load average {m['load_average']} → {m['load_average_end']}.",
    ]
    cap = int(r["limits"]["RUNLEDGER_MAX_STREAMS_PER_USER"])
    if not total["streams_refused"] and max(h["streams_held_most"] for _, h in hostile) > cap:
        lines.append(f"No stream was refused: this revision does not enforce MAX_STREAMS_PER_USER={cap}.")
    if r["hostile_errors"]:
        lines.append(f"Hostile client errors: {r['hostile_errors'][:5]}")
    return "\n".join(lines) + "\n"
