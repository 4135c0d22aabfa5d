"""The platform's measurements, each a function of a running setup (`bench.lib.Ctx`): a migrated
database, one uvicorn web process, worker processes, a user with a token. Import only after
`django.setup()`.

Every time is wall-clock on this one machine (client, web, workers and PostgreSQL share it):
`time.time()` in this process against `created_at`/`released_at` written by the others.
"""

import asyncio
import json
import subprocess
import time
from datetime import timedelta
from typing import Any

import psycopg
import uvloop
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from bench.lib import (
    ROOT,
    WEB_APP_NAME,
    CpuMeter,
    Ctx,
    Http,
    Sampler,
    parse_sse,
    sse_blocking,
    sse_request,
    summary,
)
from bench.rows import insert_select
from runs import services
from runs.events import EventType
from runs.models import Run, RunAttempt, RunEvent
from tests.support.db import connections_named
from tests.support.procs import proc_status
from tests.support.sse import Event
from tests.support.sse_writer import paced_command
from tests.support.waiting import wait_until


def _close() -> None:
    connection.close()


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
    try:
        return wait_until(predicate, timeout, what, interval)
    finally:
        _close()


# --- runs made directly (no worker claims them) -------------------------------------------------


def make_running_run(ctx: Ctx, events: int = 0, label: str = "writer") -> Run:
    """A run in `running` with attempt 1 held by this benchmark (a lease of a day, so no sweeper
    touches it), and `events` stored output.delta events written with COPY. Appends and the
    terminal write then go through the service layer like a worker's."""
    now = timezone.now()
    run = Run.objects.create(
        owner=ctx.user,
        agent="demo",
        input={"bench": label},
        status="running",
        generation=1,
        created_at=now,
        started_at=now,
        updated_at=now,
    )
    RunAttempt.objects.create(
        run=run,
        generation=1,
        worker="bench",
        claimed_at=now,
        heartbeat_at=now,
        lease_expires_at=now + timedelta(days=1),
    )
    if events:
        with psycopg.connect(ctx.url) as conn, conn.cursor() as cur:
            with cur.copy("COPY runs_runevent (run_id, seq, type, data, attempt, created_at) FROM STDIN") as copy:
                for seq in range(1, events + 1):
                    copy.write_row((run.pk, seq, EventType.OUTPUT_DELTA, json.dumps({"text": f"chunk {seq} "}), 1, now))
            cur.execute("UPDATE runs_run SET last_seq = %s WHERE id = %s", (events, run.pk))
        run.last_seq = events
    _close()
    return run


def complete(run: Run) -> None:
    services.run_complete(run_id=run.pk, generation=run.generation, output={"bench": True})
    _close()


# --- cancel -------------------------------------------------------------------------------------


def streaming_runs(
    ctx: Ctx, *, runs: int, delay_ms: int, floor: list[str] | None = None, settle: float = 1.0
) -> tuple[list[Any], Any]:
    """`runs` demo runs streaming a delta every `delay_ms` in the workers (they stream on until
    cancelled); returns their ids once every one is running and has streamed, `settle` s past the
    claim burst.

    `floor` (bench/floor.py's command line) runs the floor once more then: the same raw work under
    the same background load; its figures are returned beside the ids (None without it)."""
    created = [
        services.run_create(
            owner=ctx.user, agent="demo", input={"deltas": 100_000, "delay_ms": delay_ms}
        )  # the demo's bound
        for _ in range(runs)
    ]
    ids = [r.pk for r in created]

    def all_streaming() -> bool:
        running = Run.objects.filter(pk__in=ids, status="running").count()
        streaming = (
            RunEvent.objects.filter(run_id__in=ids, type=EventType.OUTPUT_DELTA).values("run_id").distinct().count()
        )
        return running == len(ids) and streaming == len(ids)

    wait_for(all_streaming, 180, f"{runs} runs streaming", interval=0.25)
    time.sleep(settle)  # past the claim burst
    floor_under_load = None
    if floor:
        done = subprocess.run(floor, check=True, capture_output=True, text=True)
        floor_under_load = json.loads(done.stdout.strip().splitlines()[-1])
    return ids, floor_under_load


def cancel(
    ctx: Ctx, *, runs: int, delay_ms: int, gap_ms: int, via: str, floor: list[str] | None = None, settle: float = 1.0
) -> dict[str, Any]:
    """`runs` demo runs streaming in the workers; cancel each (service call or HTTP POST) and
    measure request start → committed response, and → the attempt's released_at.

    `floor`: the floor measured once more while the runs stream, just before the cancels."""
    ids, floor_under_load = streaming_runs(ctx, runs=runs, delay_ms=delay_ms, floor=floor, settle=settle)
    http = Http(ctx.base, ctx.token) if via == "http" else None
    cpu = CpuMeter({"web": ctx.web.pid, **{f"worker{i}": w.pid for i, w in enumerate(ctx.workers)}})
    started: dict[Any, float] = {}
    committed_at: dict[Any, float] = {}
    committed_ms: list[float] = []
    try:
        for run_id in ids:
            t0 = time.time()
            if http is not None:
                status, body = http.request("POST", f"/api/runs/{run_id}/cancel/", {"note": "bench"})
                assert status == 200 and body["status"] == "cancelled", (status, body)
            else:
                result = services.run_cancel(run_id=run_id, actor=ctx.user, note="bench")
                assert result.changed
            t1 = time.time()
            committed_ms.append((t1 - t0) * 1000)
            started[run_id], committed_at[run_id] = t0, t1
            time.sleep(gap_ms / 1000)
    finally:
        load = cpu.stop()
        if http is not None:
            http.close()
        _close()

    def all_released() -> list[RunAttempt]:
        attempts = list(RunAttempt.objects.filter(run_id__in=ids, released_at__isnull=False))
        return attempts if len(attempts) == len(ids) else []

    attempts = wait_for(all_released, 120, "every release")
    released_ms = [(a.released_at.timestamp() - started[a.run_id]) * 1000 for a in attempts if a.released_at]
    after_commit_ms = [(a.released_at.timestamp() - committed_at[a.run_id]) * 1000 for a in attempts if a.released_at]
    return {
        "via": via,
        "runs": runs,
        "delay_ms": delay_ms,
        "gap_ms": gap_ms,
        "committed_ms": summary(committed_ms),
        "released_ms": summary(released_ms),
        "released_after_commit_ms": summary(after_commit_ms),
        "outcomes": sorted({a.outcome for a in attempts}),
        "cpu_during_cancels": load,
        "floor_under_load": floor_under_load,
    }


# --- start --------------------------------------------------------------------------------------


def start(ctx: Ctx, *, samples: int) -> dict[str, Any]:
    """POST /api/runs/ → a watcher connected right after the 201 (after_seq=0) → the worker's
    first events (run.started, then the first output.delta) arrive at that watcher."""
    http = Http(ctx.base, ctx.token)
    create_ms, started_ms, delta_ms = [], [], []
    try:
        for _ in range(samples):
            t0 = time.time()
            status, body = http.request("POST", "/api/runs/", {"agent": "demo", "input": {"deltas": 1, "delay_ms": 0}})
            assert status == 201, (status, body)
            create_ms.append((time.time() - t0) * 1000)
            _, chunks = sse_blocking(
                ctx.base,
                f"/api/runs/{body['id']}/stream/?after_seq=0",
                ctx.token,
                until=lambda raw: b"event: output.delta\n" in raw,
                timeout=30,
            )
            frames = {f.event: f for f in reversed(parse_sse(chunks))}
            started_ms.append((frames[EventType.RUN_STARTED].received_at - t0) * 1000)
            delta_ms.append((frames[EventType.OUTPUT_DELTA].received_at - t0) * 1000)
            time.sleep(0.1)
    finally:
        http.close()
    return {
        "samples": samples,
        "create_response_ms": summary(create_ms),
        "to_run_started_ms": summary(started_ms),
        "to_first_delta_ms": summary(delta_ms),
    }


# --- append -------------------------------------------------------------------------------------


def _span(run_id: Any) -> tuple[float, float, int]:
    rows = list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("type", "created_at"))
    started = next(t for ty, t in rows if ty == EventType.RUN_STARTED)
    ended = rows[-1][1]
    deltas = sum(1 for ty, _ in rows if ty == EventType.OUTPUT_DELTA)
    return started.timestamp(), ended.timestamp(), deltas


def _batches(run_id: Any) -> int:
    return RunEvent.objects.filter(run_id=run_id, type=EventType.OUTPUT_DELTA).values("created_at").distinct().count()


def append_one(ctx: Ctx, *, deltas: int) -> dict[str, Any]:
    """One demo run with delay_ms 0: events/s committed (run.started → terminal, from the events'
    created_at), and delivered live to one SSE watcher connected right after the create."""
    run = services.run_create(owner=ctx.user, agent="demo", input={"deltas": deltas, "delay_ms": 0})
    _close()
    _, chunks = sse_blocking(ctx.base, f"/api/runs/{run.pk}/stream/?after_seq=0", ctx.token, timeout=300)
    frames = [f for f in parse_sse(chunks) if f.event == EventType.OUTPUT_DELTA]
    assert len(frames) == deltas and [f.seq for f in frames] == list(range(frames[0].seq, frames[0].seq + deltas))
    begin, end, stored = _span(run.pk)
    batches = _batches(run.pk)
    _close()
    live_seconds = frames[-1].received_at - frames[0].received_at
    return {
        "deltas": stored,
        "transactions": batches,
        "events_per_transaction": round(stored / batches, 1),
        "committed_seconds": round(end - begin, 3),
        "committed_events_per_s": round(stored / (end - begin)),
        "delivered_live_events_per_s": round(len(frames) / live_seconds) if live_seconds > 0 else None,
    }


def append_many(ctx: Ctx, *, runs: int, deltas: int) -> dict[str, Any]:
    """`runs` demo runs at once (delay_ms 0) over the workers: total events/s committed."""
    created = [
        services.run_create(owner=ctx.user, agent="demo", input={"deltas": deltas, "delay_ms": 0}) for _ in range(runs)
    ]
    ids = [r.pk for r in created]
    wait_for(
        lambda: Run.objects.filter(pk__in=ids, status="completed").count() == runs,
        600,
        "every run completed",
        interval=0.1,
    )
    spans = [_span(i) for i in ids]
    workers = sorted(set(RunAttempt.objects.filter(run_id__in=ids).values_list("worker", flat=True)))
    _close()
    begin, end = min(s[0] for s in spans), max(s[1] for s in spans)
    total = sum(s[2] for s in spans)
    return {
        "runs": runs,
        "deltas_each": deltas,
        "workers_used": len(workers),
        "committed_seconds": round(end - begin, 3),
        "committed_events_per_s": round(total / (end - begin)),
    }


# --- stream and replay --------------------------------------------------------------------------


def _stream_all(ctx: Ctx, run: Run, expect: int) -> tuple[float, list[Event]]:
    t0, chunks = sse_blocking(ctx.base, f"/api/runs/{run.pk}/stream/?after_seq=0", ctx.token, timeout=300)
    frames = parse_sse(chunks)
    assert [f.seq for f in frames] == list(range(1, expect + 1)), (len(frames), expect)
    return t0, frames


def stream_one(ctx: Ctx, *, events: int) -> dict[str, Any]:
    """One SSE client reads a finished run of `events` stored deltas (+ its terminal event)."""
    run = make_running_run(ctx, events, label="stream")
    complete(run)
    results = []
    for _ in range(3):
        t0, frames = _stream_all(ctx, run, events + 1)
        results.append((frames[-1].received_at - t0, frames[0].received_at - t0))
    seconds, first = sorted(results)[1]  # the median of three
    return {
        "events": events + 1,
        "source": "stored (finished run, read from after_seq=0)",
        "seconds": round(seconds, 3),
        "first_event_ms": round(first * 1000, 1),
        "events_per_s": round((events + 1) / seconds),
        "tries_seconds": [round(r[0], 3) for r in results],
    }


def replay(ctx: Ctx, *, events: int, run: Run | None = None) -> tuple[dict[str, Any], Run]:
    """Catch up `events` stored events from after_seq=0: JSON pages of 1000, and one SSE stream."""
    if run is None:
        run = make_running_run(ctx, events, label="replay")
        complete(run)
    total = events + 1
    http = Http(ctx.base, ctx.token)
    json_tries, sse_tries = [], []
    try:
        for _ in range(3):
            after, got, t0 = 0, 0, time.time()
            while True:
                status, page = http.request("GET", f"/api/runs/{run.pk}/events/?after_seq={after}&limit=1000")
                assert status == 200, (status, page)
                got += len(page["results"])
                after = page["next_after_seq"]
                if page["end_of_stream"]:
                    break
            json_tries.append(time.time() - t0)
            assert got == total, (got, total)
            t0, frames = _stream_all(ctx, run, total)
            sse_tries.append(frames[-1].received_at - t0)
    finally:
        http.close()
    json_s, sse_s = sorted(json_tries)[1], sorted(sse_tries)[1]
    return {
        "events": total,
        "json_pages_seconds": round(json_s, 3),
        "json_pages_events_per_s": round(total / json_s),
        "sse_seconds": round(sse_s, 3),
        "sse_events_per_s": round(total / sse_s),
        "json_tries_seconds": [round(x, 3) for x in json_tries],
        "sse_tries_seconds": [round(x, 3) for x in sse_tries],
    }, run


# --- many watchers of one run -------------------------------------------------------------------


def _web_connections() -> int:
    try:
        return connections_named(WEB_APP_NAME)
    finally:
        _close()


async def _watch(ctx: Ctx, path: str, connected: asyncio.Event, gate: asyncio.Semaphore) -> list[tuple[float, bytes]]:
    async with gate:
        reader, writer = await asyncio.open_connection("127.0.0.1", ctx.web.port)
        writer.write(sse_request(ctx.base, path, ctx.token))
        await writer.drain()
        chunks: list[tuple[float, bytes]] = []
        while not connected.is_set():
            data = await reader.read(1 << 16)
            if not data:
                raise ConnectionError("closed before the stream began")
            chunks.append((time.time(), data))
            if b"retry:" in b"".join(c for _, c in chunks):
                connected.set()
    try:
        while data := await reader.read(1 << 16):
            chunks.append((time.time(), data))
    finally:
        writer.close()
    return chunks


def watchers(ctx: Ctx, *, n: int, events: int, interval: float, settle: float = 2.0) -> dict[str, Any]:
    """`n` SSE watchers of one live run on the one web process; a writer process appends one
    event per transaction every `interval` s through the service and reports each commit's time.
    The web process's memory is read `settle` s after the last watcher connected."""
    run = make_running_run(ctx, 0, label=f"watchers-{n}")
    path = f"/api/runs/{run.pk}/stream/?after_seq=0"
    before = proc_status(ctx.web.pid)

    async def bench() -> dict[str, Any]:
        gate = asyncio.Semaphore(64)  # connects in flight at once, as browsers arriving
        connected = [asyncio.Event() for _ in range(n)]
        t0 = time.monotonic()
        tasks = [asyncio.create_task(_watch(ctx, path, c, gate)) for c in connected]
        await asyncio.wait_for(asyncio.gather(*(c.wait() for c in connected)), 600)
        connect_seconds = time.monotonic() - t0
        await asyncio.sleep(settle)
        idle = {**proc_status(ctx.web.pid), "db_connections": await asyncio.to_thread(_web_connections)}
        sampler = Sampler(ctx.web.pid, _web_connections, interval=0.1)
        sampler.start()
        cpu = CpuMeter({"web": ctx.web.pid})
        writer = await asyncio.create_subprocess_exec(
            *paced_command(run.pk, run.generation, count=events, interval=interval),
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await writer.communicate()
        load = cpu.stop()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 120)
        sampler.stop_event.set()
        sampler.join()
        return {
            "results": results,
            "out": out,
            "idle": idle,
            "peak": sampler.peak,
            "connect": connect_seconds,
            "cpu": load,
        }

    # The thousand clients share this one process and its core with the writer: on uvloop, as the
    # web process runs, so that their own reading adds as little as it can to what is measured.
    measured = uvloop.run(bench())
    committed = {int(s): float(t) for s, t in (line.split() for line in measured["out"].decode().splitlines())}
    failures = [repr(r) for r in measured["results"] if isinstance(r, BaseException)]
    delays: list[float] = []
    complete_watchers = 0
    for chunks in measured["results"]:
        if isinstance(chunks, BaseException):
            continue
        frames = parse_sse(chunks)
        if [f.seq for f in frames] == sorted(committed):
            complete_watchers += 1
        delays.extend((f.received_at - committed[f.seq]) * 1000 for f in frames if f.seq in committed)
    return {
        "watchers": n,
        "events": len(committed),
        "interval_s": interval,
        "watchers_with_every_event_in_order": complete_watchers,
        "failures": failures[:5],
        "connect_all_seconds": round(measured["connect"], 2),
        "delay_ms": summary(delays),
        "web_before": before,
        "web_idle": measured["idle"],
        "web_peak": measured["peak"],
        "cpu_while_writing": measured["cpu"],
    }


# --- growth: background rows --------------------------------------------------------------------


def add_background(url: str, *, runs: int, events_per_run: int) -> dict[str, Any]:
    """Finished runs of another user, each with an attempt and `events_per_run` events (at least
    3: created, started, completed), inserted with INSERT … SELECT generate_series into the
    database at `url`; then ANALYZE (what autovacuum keeps up to date) and a CHECKPOINT."""
    t0 = time.time()
    owner, _ = User.objects.get_or_create(username="background")
    _close()
    run_sql, run_params = insert_select(
        Run,
        {
            "id": "id",
            "owner_id": "%(owner)s",
            "agent": "'demo'",
            "input": """'{"deltas": 8}'""",
            "status": "'completed'",
            "output": """'{"deltas": 8}'""",
            "last_seq": "%(n)s",
            "generation": "1",
            "steps_used": "2",
            "events_used": "%(n)s - 3",
            "created_at": "created_at",
            "started_at": "created_at",
            "ended_at": "created_at + interval '2 s'",
            "updated_at": "created_at + interval '2 s'",
            "input_bytes": "13",
            "output_bytes": "13",
            # The input, the output and about 20 bytes an event.
            "stored_bytes": "%(bytes)s",
            "ended_bytes": "%(bytes)s",
        },
        "FROM bg",
    )
    attempt_sql, attempt_params = insert_select(
        RunAttempt,
        {
            "run_id": "id",
            "generation": "1",
            "worker": "'background'",
            "claimed_at": "created_at",
            "heartbeat_at": "created_at",
            "lease_expires_at": "created_at + interval '30 s'",
            "released_at": "created_at + interval '2 s'",
            "outcome": "'completed'",
        },
        "FROM bg",
    )
    event_sql, event_params = insert_select(
        RunEvent,
        {
            "run_id": "bg.id",
            "seq": "s",
            "type": "CASE WHEN s = 1 THEN %(created)s WHEN s = 2 THEN %(started)s "
            "WHEN s = %(n)s THEN %(completed)s ELSE %(delta)s END",
            "data": "CASE WHEN s < 3 OR s = %(n)s THEN '{}'::jsonb ELSE jsonb_build_object('text', 'chunk ' || s) END",
            "attempt": "CASE WHEN s = 1 THEN NULL ELSE 1 END",
            "created_at": "bg.created_at",
        },
        "FROM bg CROSS JOIN generate_series(1, %(n)s) AS s ORDER BY bg.created_at, s",
    )
    given = {
        "owner": owner.pk,
        "n": events_per_run,
        "bytes": 26 + 20 * events_per_run,
        "created": EventType.RUN_CREATED.value,
        "started": EventType.RUN_STARTED.value,
        "completed": EventType.RUN_COMPLETED.value,
        "delta": EventType.OUTPUT_DELTA.value,
    }
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE bg (id uuid primary key, created_at timestamptz)")
        conn.execute(
            "INSERT INTO bg SELECT gen_random_uuid(), now() - make_interval(secs => i * 3) "
            "FROM generate_series(1, %s) AS i",
            (runs,),
        )
        for sql, defaults in ((run_sql, run_params), (attempt_sql, attempt_params), (event_sql, event_params)):
            conn.execute(sql, {**defaults, **given})
        conn.execute("ANALYZE")
        # Flushed now, so that writing out the inserted pages does not overlap the measurements:
        # the rows are meant to be already in the database, not on their way to disk.
        conn.execute("CHECKPOINT")
        counts = conn.execute(
            "SELECT (SELECT count(*) FROM runs_run), (SELECT count(*) FROM runs_runevent), "
            "pg_size_pretty(pg_database_size(current_database()))"
        ).fetchone()
    assert counts is not None
    return {
        "added_runs": runs,
        "added_events": runs * events_per_run,
        "seconds": round(time.time() - t0, 1),
        "total_runs": counts[0],
        "total_events": counts[1],
        "database_size": counts[2],
    }


def explain(ctx: Ctx, run_id: Any) -> dict[str, str]:
    """EXPLAIN ANALYZE of the hot queries, run against the current data."""
    from runs.selectors import run_list

    plans = {
        "events_after (stream/page read)": RunEvent.objects.filter(run_id=run_id, seq__gt=50_000)
        .order_by("seq")
        .values_list("seq", "type", "data", "created_at", "attempt")[:1000],
        "claim (oldest queued)": Run.objects.filter(status="queued").order_by("created_at", "id")[:1],
        "sweep leases": RunAttempt.objects.filter(
            run__status="running", lease_expires_at__lt=timezone.now(), generation=1
        ).order_by("lease_expires_at")[:100],
        "sweep deadlines": Run.objects.filter(
            status__in=["queued", "running", "waiting"], deadline__lt=timezone.now()
        ).order_by("deadline")[:100],
        "run list page (own runs)": run_list(user=ctx.user)[:50],
        "run list page (an owner of every background run)": run_list(user=User.objects.get(username="background"))[:50],
    }
    out = {}
    for name, qs in plans.items():
        out[name] = qs.explain(analyze=True)
    _close()
    return out
