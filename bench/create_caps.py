"""What the per-user caps on runs kept and bytes stored cost a create.

    .venv/bin/python -m bench create_caps [--kept 9000] [--users 10] [--samples 300]

A throwaway durable PostgreSQL cluster holding `--users` users with `--kept` finished runs each,
inserted interleaved (one of each user's in turn, as users working at once make them) and vacuumed,
as autovacuum leaves a table. The benchmark's own user is one of them. Two web processes on it:
one with RUNLEDGER_MAX_RUNS_PER_USER and RUNLEDGER_MAX_STORED_BYTES_PER_USER set (the create counts
and sums the user's runs: `runs.services.quotas.check_create`), one with both 0 (only the
active-runs count, as before the caps). `--samples` creates of each, one after another on a
kept-alive connection, alternating between the two so that both see the same machine, and the
statement that reads the user's totals under EXPLAIN ANALYZE. Figures only.
"""

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from bench.lib import Http, app_running, durable_cluster, git_revision, log, machine_facts, summary
from bench.rows import cancelled_runs, insert_select
from tests.support.procs import Procs

# A cancelled run of each user in turn.
_RUN = cancelled_runs(owner_id="u.id", ended_by="u.username")
_USERS = """FROM generate_series(1, %(kept)s) AS n CROSS JOIN (SELECT id, username FROM auth_user WHERE id = ANY(%(users)s)) u
ORDER BY n, u.id"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kept", type=int, default=9000, help="finished runs each user keeps")
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--samples", type=int, default=300)
    args = parser.parse_args()
    # The app's web process counts and sums this user's runs (bench/lib.py sets every cap to 0): a
    # runs cap above what they keep, the default byte cap.
    os.environ["RUNLEDGER_MAX_RUNS_PER_USER"] = "1000000"
    os.environ["RUNLEDGER_MAX_STORED_BYTES_PER_USER"] = "1000000000"
    report: dict[str, Any] = {"revision": git_revision(), "machine": machine_facts(), "args": vars(args)}
    with durable_cluster() as cluster, app_running(cluster, workers=0) as ctx:
        from django.contrib.auth.models import User
        from django.db import connection

        from runs.models import LIVE_VALUES, Run
        from runs.models import TERMINAL_VALUES as ENDED
        from runs.services.quotas import OWNED_SQL

        users = [ctx.user.pk] + [User.objects.create_user(f"other{i}").pk for i in range(args.users - 1)]
        log(f"{args.users} users x {args.kept} finished runs")
        with connection.cursor() as cursor:
            insert, defaults = insert_select(Run, _RUN, _USERS)
            cursor.execute(insert, {**defaults, "kept": args.kept, "users": users})
            cursor.execute("VACUUM ANALYZE runs_run")
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + OWNED_SQL, [ctx.user.pk, *LIVE_VALUES, ctx.user.pk, *ENDED])
            report["totals_plan"] = [row[0] for row in cursor.fetchall()]
            # The sum over every run of the owner that this replaced (a heap page per run).
            cursor.execute(
                "EXPLAIN (ANALYZE, BUFFERS) SELECT COUNT(*), SUM(stored_bytes) FROM runs_run WHERE owner_id = %s",
                [ctx.user.pk],
            )
            report["heap_sum_plan"] = [row[0] for row in cursor.fetchall()]
        connection.close()
        env = {**os.environ, "RUNLEDGER_MAX_RUNS_PER_USER": "0", "RUNLEDGER_MAX_STORED_BYTES_PER_USER": "0"}
        procs = Procs(Path(ctx.web.log_path).parent)
        try:
            uncapped = procs.uvicorn(env={**env, "DATABASE_URL": ctx.url}, timeout=60)
            capped = Http(ctx.base, ctx.token)  # the app's web process: the default caps, runs cap raised
            plain = Http(uncapped.url, ctx.token)
            timings: dict[str, list[float]] = {"caps_set": [], "caps_0": []}
            body = {"agent": "demo", "input": {"deltas": 1}}
            for http in (capped, plain):
                for _ in range(20):  # the pool's connections, the first imports and caches
                    http.request("GET", "/healthz/")
            for _ in range(args.samples):
                for name, http in (("caps_set", capped), ("caps_0", plain)):
                    t0 = time.perf_counter()
                    status, answer = http.request("POST", "/api/runs/", body)
                    timings[name].append((time.perf_counter() - t0) * 1000)
                    assert status == 201, (status, answer)
            report["create_ms"] = {name: summary(ms) for name, ms in timings.items()}
        finally:
            procs.stop_all()
    print(json.dumps(report, indent=2))
    return 0
