"""The floor under Runledger's hot paths: the same statements, in raw psycopg, on the same database.

    .venv/bin/python -m bench floor DATABASE_URL [--samples 500] [--append-seconds 3] [--replay-rows 100000]

How it works: docs/benchmarks.md#method-floor.
"""

import argparse
import json
import multiprocessing
import multiprocessing.connection
import time
import uuid
from typing import Any

import psycopg

CHANNEL = "floor_events"
WARM_UP = 20  # transactions before the measured ones: connection caches, the first page of the index
# The idle floor's pause before each transaction: about what a request spends away from its database
# (HTTP, Python). On a VM whose idle CPUs halt, a round trip after such a pause waits for the server's
# process to be woken, where back to back it does not (docs/benchmarks.md#method-floor).
IDLE_S = 0.001
PAGE = 1000
# The least that runs every measurement (the suite's smoke runs: figures that mean nothing).
SMOKE_OPTIONS = ("--samples", "5", "--append-seconds", "0.2", "--replay-rows", "1000")
DELTA = '{"text": "the sky is blue "}'

SCHEMA = """
DROP TABLE IF EXISTS floor_event;
DROP TABLE IF EXISTS floor_run;
CREATE TABLE floor_run (
    id uuid PRIMARY KEY,
    status varchar(16) NOT NULL,
    last_seq integer NOT NULL DEFAULT 0,
    events_used integer NOT NULL DEFAULT 0,
    generation integer NOT NULL DEFAULT 1,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE floor_event (
    id bigserial PRIMARY KEY,
    run_id uuid NOT NULL REFERENCES floor_run (id) DEFERRABLE INITIALLY DEFERRED,
    seq integer NOT NULL,
    type varchar(64) NOT NULL,
    data jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    attempt integer,
    UNIQUE (run_id, seq)
);
"""


def percentile(values: list[float], p: float) -> float:
    """Nearest rank on the sorted values (the other benchmarks' rule)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def new_run(conn: psycopg.Connection[Any]) -> uuid.UUID:
    run_id = uuid.uuid4()
    with conn.transaction():
        conn.execute("INSERT INTO floor_run (id, status) VALUES (%s, 'running')", (run_id,))
    return run_id


def lock_check_write(conn: psycopg.Connection[Any], run_id: uuid.UUID, events: int, note: str) -> None:
    """One transaction of the hot path: lock, check, write the run and its events, notify."""
    with conn.transaction():
        status, generation = conn.execute(
            "SELECT status, generation FROM floor_run WHERE id = %s FOR NO KEY UPDATE", (run_id,)
        ).fetchone() or (None, None)
        if status != "running":
            raise RuntimeError(f"floor run {run_id} is {status}, not running")
        (last,) = conn.execute(
            "UPDATE floor_run SET last_seq = last_seq + %s, events_used = events_used + %s, updated_at = now() "
            "WHERE id = %s RETURNING last_seq",
            (events, events, run_id),
        ).fetchone() or (0,)
        rows = [(run_id, seq, "output.delta", DELTA, generation) for seq in range(last - events + 1, last + 1)]
        values = ", ".join(["(%s, %s, %s, %s::jsonb, %s)"] * len(rows))
        conn.execute(
            f"INSERT INTO floor_event (run_id, seq, type, data, attempt) VALUES {values}",
            [value for row in rows for value in row],
        )
        conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, note))


def listen(url: str, ready: Any, out: multiprocessing.connection.Connection) -> None:
    """In a process of its own: each notification's payload and the moment it arrived."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"LISTEN {CHANNEL}")
        ready.set()
        for note in conn.notifies():
            arrived = time.monotonic()
            if note.payload == "stop":
                return
            out.send((note.payload, arrived))


def measure_lock_check_write(url: str, samples: int) -> dict[str, dict[str, float]]:
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    receive, send = ctx.Pipe(duplex=False)
    listener = ctx.Process(target=listen, args=(url, ready, send), daemon=True)
    listener.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the LISTEN process did not start")
        commit_ms: list[float] = []
        notified_ms: list[float] = []
        idle_ms: list[float] = []
        with psycopg.connect(url) as conn:
            run_id = new_run(conn)
            for i in range(WARM_UP + 2 * samples):
                idle = i >= WARM_UP + samples  # the second half: each after a pause
                if idle:
                    time.sleep(IDLE_S)
                started = time.monotonic()
                lock_check_write(conn, run_id, 1, str(i))
                committed = time.monotonic()
                if not receive.poll(10):
                    raise RuntimeError(f"notification {i} never arrived")
                payload, arrived = receive.recv()
                if payload != str(i):
                    raise RuntimeError(f"notification {payload} arrived for transaction {i}")
                if idle:
                    idle_ms.append((committed - started) * 1000)
                elif i >= WARM_UP:
                    commit_ms.append((committed - started) * 1000)
                    notified_ms.append((arrived - started) * 1000)
            with conn.transaction():
                conn.execute("SELECT pg_notify(%s, 'stop')", (CHANNEL,))
    finally:
        listener.join(10)
        if listener.is_alive():
            listener.kill()
    return {
        "lock_check_write_ms": {"p50": percentile(commit_ms, 50), "p99": percentile(commit_ms, 99)},
        "txn_start_to_notified_ms": {"p50": percentile(notified_ms, 50), "p99": percentile(notified_ms, 99)},
        "lock_check_write_idle_ms": {"p50": percentile(idle_ms, 50), "p99": percentile(idle_ms, 99)},
    }


def measure_appends(url: str, seconds: float) -> dict[str, int]:
    out = {}
    with psycopg.connect(url) as conn:
        for batch in (1, 10, 100):
            run_id = new_run(conn)
            for _ in range(WARM_UP // 4):
                lock_check_write(conn, run_id, batch, "append")
            written, started = 0, time.monotonic()
            while (elapsed := time.monotonic() - started) < seconds:
                lock_check_write(conn, run_id, batch, "append")
                written += batch
            out[f"append_batch_{batch}_ev_per_s"] = round(written / elapsed)
    return out


def measure_replay(url: str, rows: int) -> dict[str, Any]:
    with psycopg.connect(url) as conn:
        run_id = new_run(conn)
        with conn.transaction(), conn.cursor() as cur:
            with cur.copy("COPY floor_event (run_id, seq, type, data, attempt) FROM STDIN") as copy:
                for seq in range(1, rows + 1):
                    copy.write_row((run_id, seq, "output.delta", DELTA, 1))
            cur.execute("UPDATE floor_run SET last_seq = %s WHERE id = %s", (rows, run_id))
        conn.execute("ANALYZE floor_event")
        conn.commit()
        read, cursor, started = 0, 0, time.monotonic()
        while True:
            page = conn.execute(
                "SELECT seq, type, data, created_at, attempt FROM floor_event "
                "WHERE run_id = %s AND seq > %s ORDER BY seq LIMIT %s",
                (run_id, cursor, PAGE),
            ).fetchall()
            if not page:
                break
            read += len(page)
            cursor = page[-1][0]
        took = time.monotonic() - started
        conn.rollback()
    if read != rows:
        raise RuntimeError(f"replay read {read} of {rows} events")
    return {"replay_100k_s": round(took, 3), "replay_rows": read}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="a scratch PostgreSQL database (postgres://…)")
    parser.add_argument("--samples", type=int, default=500, help="lock-check-write transactions timed")
    parser.add_argument("--append-seconds", type=float, default=3.0, help="how long each batch size appends")
    parser.add_argument("--replay-rows", type=int, default=100_000, help="events replayed")
    args = parser.parse_args()

    with psycopg.connect(args.url, autocommit=True) as conn:
        conn.execute(SCHEMA)
    try:
        figures: dict[str, Any] = {}
        figures.update(measure_lock_check_write(args.url, args.samples))
        figures.update(measure_appends(args.url, args.append_seconds))
        figures.update(measure_replay(args.url, args.replay_rows))
    finally:
        with psycopg.connect(args.url, autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS floor_event; DROP TABLE IF EXISTS floor_run")
    for key, value in figures.items():
        print(f"{key:28} {value}")
    print(json.dumps(figures))
