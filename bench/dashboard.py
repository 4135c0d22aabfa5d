"""What the staff dashboard's figures cost as history grows: the same recent activity on top of x1
and x100 history, on a throwaway PostgreSQL.

    .venv/bin/python -m bench dashboard [--repeats 20] [--scale 1.0]

How it works: docs/benchmarks.md#method-dashboard.
"""

import argparse
import json
import os
import statistics
import subprocess
import time
from typing import Any

from bench.lib import RESULTS, ROOT, bench_command, durable_cluster, log, machine_facts, postgres_facts

TIERS = [("x1", 1_000), ("x100", 100_000)]
EVENTS_PER_RUN = 10
RECENT_ENDED = 600
RECENT_EVENTS = 36_000
HELD = 40
QUEUED = 30
WAITING = 10


def _columns(model: Any, skip: tuple[str, ...]) -> list[str]:
    return [f.column for f in model._meta.concrete_fields if f.column not in skip]


def seed(history: int, scale: float = 1.0) -> None:
    """History first, then the last hour's activity (its counts times `scale`, at least one of each
    and four held, two of them stale): the order the application writes them in."""
    from django.contrib.auth.models import User
    from django.db import connection

    from runs import services
    from runs.models import Run, RunAttempt
    from tests.factories import running_run

    owner = User.objects.create_user("dashboard-bench")
    done = running_run(owner, input={"deltas": 1})
    services.run_complete(run_id=done.pk, generation=done.generation, output={"text": "x"})
    cancelled = running_run(owner, input={"deltas": 1})
    services.run_cancel(run_id=cancelled.pk, actor=owner)
    services.run_attempt_release(run_id=cancelled.pk, generation=cancelled.generation)
    moved = ("id", "created_at", "started_at", "ended_at", "updated_at")
    run_cols = _columns(Run, moved)
    # Named, not every column: the values below are given in this order.
    event_cols = "run_id, seq, type, data, attempt, created_at, data_bytes"
    attempt_cols = (
        "run_id, generation, worker, claimed_at, heartbeat_at, lease_expires_at, released_at, outcome, "
        "machine, process_groups"
    )

    def clone(template: Any, count: int, *, ended: str, outcome: str, released: str = "e.ended_at") -> None:
        """`count` copies of `template` with `ended` (SQL over g = 1..count) as their end, each with
        EVENTS_PER_RUN events before it and one attempt released at `released`."""
        cols = ", ".join(run_cols)
        with connection.cursor() as cursor:
            cursor.execute("CREATE TEMP TABLE IF NOT EXISTS fresh (id uuid, ended_at timestamptz)")
            cursor.execute("TRUNCATE fresh")
            cursor.execute(
                f"""WITH made AS (
                      INSERT INTO runs_run (id, created_at, started_at, ended_at, updated_at, {cols})
                      SELECT gen_random_uuid(), e - interval '2 s', e - interval '1 s', e, e, {cols}
                      FROM runs_run, generate_series(1, %s) g, LATERAL (SELECT {ended} AS e) t
                      WHERE runs_run.id = %s ORDER BY e
                      RETURNING id, ended_at)
                    INSERT INTO fresh SELECT * FROM made""",
                [count, template.pk],
            )
            cursor.execute(
                f"""INSERT INTO runs_runevent ({event_cols})
                    SELECT e.id, s, 'output.delta', '{{"text": "x"}}', 1, e.ended_at - (11 - s) * interval '50 ms', 11
                    FROM fresh e, generate_series(1, %s) s ORDER BY e.ended_at, s""",
                [EVENTS_PER_RUN],
            )
            cursor.execute(
                f"""INSERT INTO runs_runattempt ({attempt_cols})
                    SELECT e.id, 1, 'bench-worker', e.ended_at - interval '1 s', e.ended_at, e.ended_at + interval '30 s',
                           {released}, %s, '', '[]'
                    FROM fresh e ORDER BY e.ended_at""",
                [outcome],
            )

    recent_ended, recent_events = max(5, int(RECENT_ENDED * scale)), max(1, int(RECENT_EVENTS * scale))
    held, waiting, queued = (max(least, int(n * scale)) for n, least in ((HELD, 4), (WAITING, 1), (QUEUED, 1)))
    # History: spread over 2 to 30 days ago, oldest first.
    clone(
        done, history, ended=f"now() - interval '30 days' + g * (interval '28 days' / {history})", outcome="completed"
    )
    # The last hour: runs ended (a fifth cancelled, released 20-80 ms after), then the events.
    recent = f"now() - interval '59 minutes' + g * (interval '58 minutes' / {recent_ended})"
    clone(done, recent_ended * 4 // 5, ended=recent, outcome="completed")
    clone(
        cancelled,
        recent_ended // 5,
        ended=recent,
        outcome="cancelled",
        released="e.ended_at + (20 + random() * 60) * interval '1 ms'",
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"""INSERT INTO runs_runevent ({event_cols})
                SELECT %s, 100 + g, 'output.delta', '{{"text": "x"}}', 1,
                       now() - interval '59 minutes' + g * (interval '58 minutes' / %s), 11
                FROM generate_series(1, %s) g""",
            [done.pk, recent_events, recent_events],
        )
    for i in range(held):
        run = running_run(owner, input={"deltas": 1})
        RunAttempt.objects.filter(run=run, outcome="").update(worker=f"worker-{i % 4}")
    # Two stale: their lease lapsed, no sweeper here.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE runs_runattempt SET lease_expires_at = now() - interval '5 s' WHERE id IN "
            "(SELECT id FROM runs_runattempt WHERE outcome = '' LIMIT 2)"
        )
    for _ in range(waiting):
        run = running_run(owner, input={"deltas": 1})
        services.run_wait(run_id=run.pk, generation=run.generation, reason="input_required", prompt="?")
    for _ in range(queued):
        services.run_create(owner=owner, agent="demo", input={"deltas": 1})
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")


def _median_ms(sql: str, repeats: int) -> float:
    from django.db import connection

    times = []
    with connection.cursor() as cursor:
        for _ in range(repeats):
            started = time.perf_counter()
            cursor.execute(sql)
            cursor.fetchall()
            times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 3)


def measure(repeats: int) -> dict[str, Any]:
    """The reads cold (this process's first: the hour's events counted) and warm (every refresh
    after: two minutes of them), each query timed alone, and the whole page."""
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from runs.selectors.clock import db_now
    from runs.selectors.overview import system_overview

    staff = User.objects.create_user("dashboard-staff", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(staff)
    reads, pages, captured_sql = [], [], []
    for _ in range(repeats + 1):
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            system_overview(now=db_now())
            reads.append((time.perf_counter() - started) * 1000)
        captured_sql.append([q["sql"] for q in captured.captured_queries])
        started = time.perf_counter()
        assert client.get("/admin/runs/dashboard/", HTTP_HOST="localhost").status_code == 200
        pages.append((time.perf_counter() - started) * 1000)
    cold, warm = captured_sql[0], captured_sql[-1]
    queries = [{"sql": sql[:160], "median_ms": _median_ms(sql, repeats)} for sql in warm]
    # The one query that differs: the events by minute, over the hour (cold) or two minutes (warm).
    events_cold = next(sql for sql in cold if "runs_runevent" in sql)
    plans = []
    with connection.cursor() as cursor:
        for sql in warm[1:]:
            cursor.execute("EXPLAIN " + sql)
            plans.append([row[0] for row in cursor.fetchall() if "Scan" in row[0]])
    return {
        "reads_cold_ms": round(reads[0], 2),
        "reads_warm_median_ms": round(statistics.median(reads[1:]), 2),
        "page_median_ms": round(statistics.median(pages[1:]), 2),
        "events_hour_query_median_ms": _median_ms(events_cold, repeats),
        "queries": queries,
        "plans": plans,
    }


def append_cost(url: str, rounds: int = 12, batches: int = 200) -> dict[str, float]:
    """What the BRIN index on the events' time adds to an append: 10-event insert transactions into
    two copies of the events table, with and without it, in alternating rounds (raw psycopg)."""
    import uuid

    import psycopg

    tables = {"without": "ab_events_plain", "with_brin": "ab_events_brin"}
    times: dict[str, list[float]] = {name: [] for name in tables}
    with psycopg.connect(url, autocommit=True) as conn:
        for table in tables.values():
            conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.execute(
                f"CREATE TABLE {table} (LIKE runs_runevent INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY)"
            )
            conn.execute(f"CREATE UNIQUE INDEX ON {table} (run_id, seq)")
        conn.execute(f"CREATE INDEX ON {tables['with_brin']} USING brin (created_at)")
        for i in range(rounds):
            for name in sorted(tables, reverse=bool(i % 2)):
                run, started = uuid.uuid4(), time.perf_counter()
                for b in range(batches):
                    with conn.transaction():
                        conn.execute(
                            f"INSERT INTO {tables[name]} (run_id, seq, type, data, attempt, created_at)"
                            " SELECT %s, g, 'output.delta', '{}', 1, now() FROM generate_series(%s::int, %s::int) g",
                            [run, b * 10 + 1, b * 10 + 10],
                        )
                times[name].append((time.perf_counter() - started) / batches * 1000)
        for table in tables.values():
            conn.execute(f"DROP TABLE {table}")
    return {name: round(statistics.median(values), 4) for name, values in times.items()}


def tier(name: str, history: int, url: str, repeats: int, scale: float = 1.0) -> dict[str, Any]:
    """One tier in this process, on its own database (a process sets Django up for one database)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ["DATABASE_URL"] = url
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    log(f"{name}: seeding {history:,} ended runs of history and the last hour's activity")
    seed(history, scale)
    with connection.cursor() as cursor:
        cursor.execute("SELECT (SELECT count(*) FROM runs_run), (SELECT count(*) FROM runs_runevent)")
        runs, events = cursor.fetchone()
    measured = measure(repeats)
    if name == "x1":
        measured["append_ms_per_10_events"] = append_cost(
            url, rounds=max(2, int(12 * scale)), batches=max(10, int(200 * scale))
        )
        log(f"{name}: a 10-event append transaction, median ms: {measured['append_ms_per_10_events']}")
    log(
        f"{name}: {runs:,} runs, {events:,} events: reads cold {measured['reads_cold_ms']} ms,"
        f" warm {measured['reads_warm_median_ms']} ms; page {measured['page_median_ms']} ms;"
        f" the hour's events by minute {measured['events_hour_query_median_ms']} ms"
    )
    for query in measured["queries"]:
        log(f"    {query['median_ms']:8.3f} ms  {query['sql'][:110]}")
    for plan in measured["plans"]:
        log(f"    plan: {' / '.join(p.strip() for p in plan)[:160]}")
    return {"runs": runs, "events": events, **postgres_facts(), **measured}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--scale", type=float, default=1.0, help="each tier's rows and the append rounds times this (0.01: a smoke run)"
    )
    parser.add_argument("--tier", help=argparse.SUPPRESS)  # with --database-url: one tier, JSON on stdout's last line
    parser.add_argument("--database-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tier:
        history = int(dict(TIERS)[args.tier] * args.scale)
        print(json.dumps(tier(args.tier, history, args.database_url, args.repeats, args.scale), default=str))
        return
    results: dict[str, Any] = {"machine": machine_facts(), "tiers": {}}
    tier_args = ["--repeats", str(args.repeats), "--scale", str(args.scale)]
    with durable_cluster() as cluster:
        for name, _ in TIERS:
            url = cluster.create_database(f"dashboard_{name}")
            out = subprocess.run(
                bench_command("dashboard", "--tier", name, "--database-url", url, *tier_args),
                cwd=ROOT,
                check=True,
                stdout=subprocess.PIPE,
                text=True,
            )
            lines = out.stdout.strip().splitlines()
            print("\n".join(lines[:-1]), flush=True)
            results["tiers"][name] = json.loads(lines[-1])
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "dashboard.json").write_text(json.dumps(results, indent=2, default=str))
