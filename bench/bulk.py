"""The run list by metadata filter as the stored runs grow, and a bulk cancel of 500 runs with a
single run's cancel measured meanwhile (docs/design/commands.md#bulk-commands).

    .venv/bin/python -m bench bulk [--base 2000] [--samples 30]

How it works: docs/benchmarks.md#method-bulk.
"""

import argparse
import json
import threading
import time
from typing import Any

from bench.lib import Http, app_running, durable_cluster, git_revision, log, machine_facts, summary
from bench.rows import cancelled_runs, insert_select

CUSTOMER = {"customer": "42"}
LONG = {"deltas": 600, "delay_ms": 100}
LIST_PATH = "/api/runs/?metadata.customer=42&page_size=50"
# A customer with one run in 5,000, the oldest ones: the filter's worst case for a walk of the
# list's order, which the GIN index on metadata is for.
SPARSE = {"customer": "c17"}
SPARSE_PATH = "/api/runs/?metadata.customer=c17&page_size=50"

# Finished runs of `owner`, each another customer's: the rows a metadata filter has to pass over.
_BACKGROUND = cancelled_runs(owner_id="%(owner)s", metadata="jsonb_build_object('customer', 'c' || (n %% 5000))")


def cancel_loop(http: Http, samples: list[float], stop: threading.Event | None, count: int) -> None:
    """Create a run and cancel it, timing the cancel, `count` times or until `stop` is set."""
    while (stop is None and len(samples) < count) or (stop is not None and not stop.is_set()):
        status, run = http.request("POST", "/api/runs/", {"agent": "demo", "input": LONG})
        assert status == 201, (status, run)
        t0 = time.perf_counter()
        status, answer = http.request("POST", f"/api/runs/{run['id']}/cancel/", {})
        samples.append((time.perf_counter() - t0) * 1000)
        assert status == 200, (status, answer)


def explain_list(owner: Any, metadata: dict[str, str]) -> list[str]:
    from django.db import connection

    from runs.selectors import run_list

    sql, params = run_list(user=owner, metadata=metadata)[:51].query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
        return [row[0] for row in cursor.fetchall()]


def measure_list(http: Http, owner: Any, samples: int) -> dict[str, Any]:
    timings: dict[str, list[float]] = {"recent": [], "sparse": []}
    for _ in range(samples):
        for name, path in (("recent", LIST_PATH), ("sparse", SPARSE_PATH)):
            t0 = time.perf_counter()
            status, _ = http.request("GET", path)
            timings[name].append((time.perf_counter() - t0) * 1000)
            assert status == 200, status
    return {
        "ms": {name: summary(ms) for name, ms in timings.items()},
        "plan": explain_list(owner, CUSTOMER),
        "sparse_plan": explain_list(owner, SPARSE),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--base", type=int, default=2000, help="runs made through the service; a quarter the customer's"
    )
    parser.add_argument("--samples", type=int, default=30)
    args = parser.parse_args()
    report: dict[str, Any] = {"revision": git_revision(), "machine": machine_facts(), "args": vars(args)}
    with durable_cluster() as cluster, app_running(cluster, workers=1, concurrency=20) as ctx:
        from django.db import connection

        from runs import services
        from runs.models import Run

        owner = ctx.user
        theirs = args.base // 4
        log(f"{args.base} runs, {theirs} of customer 42")
        for n in range(args.base):
            metadata = CUSTOMER if n % 4 == 0 else {"customer": f"c{n % 5000}"}
            services.run_create(owner=owner, agent="demo", input=LONG, metadata=metadata)
        http, other = Http(ctx.base, ctx.token), Http(ctx.base, ctx.token)
        for _ in range(20):  # the pool's connections, the first imports and caches
            http.request("GET", LIST_PATH)

        alone: list[float] = []
        cancel_loop(other, alone, None, args.samples)
        report["single_cancel_alone_ms"] = summary(alone)

        during: list[float] = []
        stop = threading.Event()
        meanwhile = threading.Thread(target=cancel_loop, args=(other, during, stop, 0))
        meanwhile.start()
        t0 = time.perf_counter()
        status, answer = http.request("POST", "/api/runs/cancel/", {"filter": {"metadata": CUSTOMER}, "max": theirs})
        took = time.perf_counter() - t0
        stop.set()
        meanwhile.join()
        assert status == 200, (status, answer)
        report["bulk_cancel"] = {"runs": theirs, "seconds": round(took, 2), "counts": answer["counts"]}
        report["single_cancel_during_bulk_ms"] = summary(during) if during else None
        log(f"bulk cancel of {theirs}: {took:.2f} s; single cancels meanwhile: {len(during)}")

        report["list"] = {}
        stored = args.base + 2 * args.samples
        for factor in (1, 10, 100):
            missing = args.base * factor - stored
            if missing > 0:
                log(f"inserting {missing} finished runs of other customers")
                with connection.cursor() as cursor:
                    insert, defaults = insert_select(Run, _BACKGROUND, "FROM generate_series(1, %(count)s) AS n")
                    cursor.execute(insert, {**defaults, "owner": owner.pk, "count": missing})
                    cursor.execute("VACUUM ANALYZE runs_run")
                stored += missing
            report["list"][f"x{factor}"] = {"stored_runs": stored, **measure_list(http, owner, args.samples)}
            log(f"x{factor}: {report['list'][f'x{factor}']['ms']}")
        connection.close()
    print(json.dumps(report, indent=2))
    return 0
