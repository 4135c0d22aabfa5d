"""Shared plumbing of the benchmarks: a throwaway cluster, the running application, clients,
statistics, machine facts. Processes, waits and SSE parsing are the tests' own (tests/support/).

Nothing here sets Django up at import, so a driver can start a cluster and point DATABASE_URL at
it before `django.setup()` (which `app_running` does).
"""

import argparse
import itertools
import json
import os
import platform
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from tests.support.procs import ROOT, Proc, Procs, proc_status
from tests.support.sse import Event, SSEParser

if TYPE_CHECKING:
    from django.contrib.auth.models import User

# Where the reports go; BENCH_RESULTS elsewhere (the CI's smoke runs write to a folder of their own).
RESULTS = Path(os.environ.get("BENCH_RESULTS", ROOT / "bench" / "results"))
WEB_APP_NAME = "bench-web"  # the web process's connections carry it, to be counted
# The benchmarks measure the platform, not its fair-use limits, and would hit them: a
# thousand watchers under one token, thousands of runs of one user, long event logs. Every process
# a benchmark starts inherits this environment (`python -m bench` sets it first: `uncap`), so these
# caps are 0 (unlimited) there unless a benchmark says otherwise (bench/fair_use.py sets its own).
UNCAPPED = {
    "RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER": "0",
    "RUNLEDGER_MAX_RUNS_PER_USER": "0",
    "RUNLEDGER_MAX_STORED_BYTES_PER_USER": "0",
    "RUNLEDGER_MAX_STREAMS_PER_USER": "0",
    "RUNLEDGER_SSE_MAX_SECONDS": "0",
    "RUNLEDGER_DEFAULT_MAX_EVENTS": "0",
    "RUNLEDGER_DEFAULT_MAX_STEPS": "0",
    "RUNLEDGER_DEFAULT_DEADLINE_SECONDS": "0",
}


def uncap() -> None:
    """UNCAPPED into this process's environment, where a variable is not set already. Not at import:
    a test that imports a part of bench/ must not lift the caps of the processes it starts."""
    for name, value in UNCAPPED.items():
        os.environ.setdefault(name, value)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- statistics ---------------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def save_and_print(
    benchmark: str, machine: dict[str, Any], result: dict[str, Any], out: str, rows: list[tuple[Any, ...]], at: str
) -> None:
    """Write a benchmark's result to `out` as JSON, then print its figures (`figures()`'s rows, each
    target shown as "target `at` N") and the result itself."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": benchmark, "machine": machine, **result}, indent=2) + "\n")
    for name, value, unit, target, _ in rows:
        print(f"{name:72} {value:>10,} {unit}" + (f"  (target {at} {target:,})" if target else ""))
    print(json.dumps(result))


def summary(ms: list[float]) -> dict[str, float]:
    if not ms:
        return {"n": 0}
    return {
        "n": len(ms),
        "p50": round(percentile(ms, 50), 2),
        "p95": round(percentile(ms, 95), 2),
        "p99": round(percentile(ms, 99), 2),
        "max": round(max(ms), 2),
        "mean": round(statistics.fmean(ms), 2),
    }


# --- the machine --------------------------------------------------------------------------------


def machine_facts(*, idle_seconds: float = 0) -> dict[str, Any]:
    """The machine; with `idle_seconds`, also how busy its CPU is meanwhile (before the benchmark
    starts anything: other users of a shared machine)."""
    before = CpuMeter({}) if idle_seconds else None
    if before is not None:
        time.sleep(idle_seconds)  # the interval measured, not a wait for anything
    cpu = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kb = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        **({"cpu_busy_pct_before_start": before.stop()["machine_cpu_busy_pct"]} if before is not None else {}),
    }


# --- a throwaway durable cluster ----------------------------------------------------------------


@dataclass
class Cluster:
    dir: Path
    url: str  # the cluster's default database (postgres)

    def database_url(self, name: str, **query: str) -> str:
        parts = urlsplit(self.url)
        q = "&".join(f"{k}={v}" for k, v in query.items())
        return urlunsplit((parts.scheme, parts.netloc, "/" + name, q, ""))

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.database_url(name)


@contextmanager
def durable_cluster() -> Iterator[Cluster]:
    """`bin/pgcluster start DIR --durable` (fsync on), stopped and deleted on the way out."""
    work = Path(tempfile.mkdtemp(prefix="runledger-bench-"))
    work.chmod(0o755)  # the server runs as another user (postgres) and must reach its folder
    pgdir = work / "pg"
    try:
        out = subprocess.run(
            [str(ROOT / "bin" / "pgcluster"), "start", str(pgdir), "--durable"],
            check=True,
            capture_output=True,
            text=True,
        )
        yield Cluster(dir=pgdir, url=out.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run([str(ROOT / "bin" / "pgcluster"), "stop", str(pgdir)], check=False)
        shutil.rmtree(work, ignore_errors=True)


# --- the floor: raw psycopg doing the same work ------------------------------------------------


def bench_command(name: str, *args: str) -> list[str]:
    """The command line of the benchmark `name` (`python -m bench NAME`); run it with cwd=ROOT."""
    return [sys.executable, "-m", "bench", name, *args]


def floor_command(url: str, *options: str) -> list[str]:
    return bench_command("floor", url, *options)


def floor_option(parser: argparse.ArgumentParser) -> None:
    """`--floor-args`: the options of the floor a benchmark measures beside its figures."""
    parser.add_argument(
        "--floor-args",
        type=shlex.split,
        default=[],
        metavar="OPTIONS",
        help="bench/floor.py's options, e.g. --floor-args='--samples 5' (default: its own)",
    )


def run_floor(url: str, *options: str) -> dict[str, Any]:
    """`bench/floor.py` against `url` (a scratch database: it makes tables of its own there)."""
    log("floor: bench/floor.py against the scratch database")
    out = subprocess.run(floor_command(url, *options), cwd=ROOT, check=True, capture_output=True, text=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


# --- measuring processes -------------------------------------------------------------------------


class Sampler(threading.Thread):
    """Peak RSS, threads and database connections of a process, sampled every `interval` s until
    `stop_event` is set."""

    def __init__(
        self,
        pid: int,
        count_connections: Callable[[], int],
        interval: float,
        status: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        # RSS and threads: of the process, or what `status` adds up (several web processes).
        self.status = status or (lambda: proc_status(self.pid))
        self.count_connections = count_connections
        self.interval = interval
        self.stop_event = threading.Event()
        self.peak = {"rss_kb": 0, "threads": 0, "db_connections": 0}

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            sample = {**self.status(), "db_connections": self.count_connections()}
            for key, value in sample.items():
                self.peak[key] = max(self.peak.get(key, 0), value)


class CpuMeter:
    """Machine CPU use (from /proc/stat) and CPU seconds of given processes over an interval."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.start = self._read()

    @staticmethod
    def _machine() -> tuple[int, int]:
        with open("/proc/stat") as f:
            values = [int(x) for x in f.readline().split()[1:]]
        idle = values[3] + values[4]
        return sum(values) - idle, sum(values)

    def _proc(self, pid: int) -> int:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return int(fields[11]) + int(fields[12])  # utime + stime (clock ticks)
        except OSError:
            return 0

    def _read(self) -> tuple[float, tuple[int, int], dict[str, int]]:
        return time.time(), self._machine(), {k: self._proc(p) for k, p in self.pids.items()}

    def stop(self) -> dict[str, Any]:
        t1, (busy1, total1), procs1 = self._read()
        t0, (busy0, total0), procs0 = self.start
        tick = os.sysconf("SC_CLK_TCK")
        seconds = max(t1 - t0, 1e-9)
        return {
            "machine_cpu_busy_pct": round(100 * (busy1 - busy0) / max(total1 - total0, 1), 1),
            "process_cores": {k: round((procs1[k] - procs0[k]) / tick / seconds, 2) for k in procs1},
            "process_seconds": {k: (procs1[k] - procs0[k]) / tick for k in procs1},
        }


# --- HTTP and SSE clients -----------------------------------------------------------------------


class Http:
    """A keep-alive HTTP/1.1 client (http.client) for JSON requests."""

    def __init__(self, base: str, token: str) -> None:
        import http.client

        parts = urlsplit(base)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        self.headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
        self.used_at = time.monotonic()

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One request on the kept-alive connection. uvicorn closes a connection idle for 5 s; one
        idle for 3 s is reconnected first (cheap on loopback) rather than raced against that."""
        import http.client

        payload = None if body is None else json.dumps(body)
        if time.monotonic() - self.used_at > 3:
            self.conn.close()
        for retry in (False, True):
            try:
                self.conn.request(method, path, body=payload, headers=self.headers)
                response = self.conn.getresponse()
                data = response.read()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.conn.close()
                if retry:
                    raise
        self.used_at = time.monotonic()
        return response.status, json.loads(data) if data else None

    def close(self) -> None:
        self.conn.close()


def parse_sse(chunks: list[tuple[float, bytes]]) -> list[Event]:
    """The events of a chunked `text/event-stream` HTTP response recorded as (arrival, raw bytes).

    The server writes whole frames per HTTP chunk, so an event's arrival (`received_at`) is that of
    the read that completed its chunk. Done after the measurement, so parsing costs the client
    nothing meanwhile.
    """
    raw = b"".join(c for _, c in chunks)
    ends = list(itertools.accumulate(len(c) for _, c in chunks))
    parser = SSEParser()
    events: list[Event] = []
    pos, i = raw.index(b"\r\n\r\n") + 4, 0
    while (line_end := raw.find(b"\r\n", pos)) >= 0:
        size = int(raw[pos:line_end].split(b";")[0], 16)
        start, stop = line_end + 2, line_end + 2 + size
        if size == 0 or stop > len(raw):
            break
        while ends[i] < stop:
            i += 1
        events += [e for e in parser.feed(raw[start:stop], at=chunks[i][0]) if e.id is not None]
        pos = stop + 2
    return events


def sse_request(base: str, path: str, token: str, extra: str = "") -> bytes:
    parts = urlsplit(base)
    return (
        f"GET {path} HTTP/1.1\r\nHost: {parts.hostname}:{parts.port}\r\nAccept: text/event-stream\r\n"
        f"Authorization: Token {token}\r\nConnection: close\r\n{extra}\r\n"
    ).encode()


def sse_blocking(
    base: str, path: str, token: str, *, until: Callable[[bytes], bool] | None = None, timeout: float = 120
) -> tuple[float, list[tuple[float, bytes]]]:
    """One stream read with a blocking socket until it ends (or `until(all bytes so far)`).

    Returns the time the request was sent and the raw reads with their arrival times."""
    parts = urlsplit(base)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout)
    chunks: list[tuple[float, bytes]] = []
    seen = b""
    try:
        t0 = time.time()
        sock.sendall(sse_request(base, path, token))
        while True:
            data = sock.recv(1 << 20)
            if not data:
                break
            chunks.append((time.time(), data))
            if until is not None:
                seen += data
                if until(seen):
                    break
            elif data.endswith(b"\r\n0\r\n\r\n"):
                break
    finally:
        sock.close()
    return t0, chunks


def git_revision() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
        return rev.strip() + ("+dirty" if dirty.strip() else "")
    except OSError:
        return ""


# --- the running application ------------------------------------------------------------------


@dataclass
class Ctx:
    """What every scenario measures against (bench/scenarios.py)."""

    url: str  # the application database
    web: Proc
    workers: list[Proc]
    user: "User"
    token: str
    notes: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        return self.web.url


@contextmanager
def app_running(
    cluster: Cluster, *, workers: int = 2, concurrency: int = 120, env: Mapping[str, str] | None = None
) -> Iterator[Ctx]:
    """The application database `runledger` migrated, one uvicorn web process and `workers` worker
    processes started (default settings but UNCAPPED), a user with a token. `env` is set in this
    process's environment first, which every process started inherits (e.g. the agents to load)."""
    url = cluster.create_database("runledger")
    os.environ.update(env or {})
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connection

    from tests.support.db import token_for

    call_command("migrate", verbosity=0)
    user = User.objects.create_user("bench", password="bench-password")
    token = token_for(user)
    connection.close()
    logs = Path(tempfile.mkdtemp(prefix="runledger-bench-logs-"))
    procs = Procs(logs)
    # Nothing is measured on the way out: the workers' runs need not reach a safe boundary first.
    env = {"RUNLEDGER_SHUTDOWN_GRACE_SECONDS": "0", **os.environ, "PYTHONUNBUFFERED": "1", "DATABASE_URL": url}
    try:
        web = procs.uvicorn(env={**env, "DATABASE_URL": f"{url}?application_name={WEB_APP_NAME}"}, timeout=60)
        started = [procs.worker(f"bench-{i}", concurrency=concurrency, env=env, timeout=60) for i in range(workers)]
        yield Ctx(url=url, web=web, workers=started, user=user, token=token)
    except BaseException:
        for proc in procs.started:
            print(f"--- {proc.name} (exit {proc.popen.poll()}), log tail:\n{proc.log()[-3000:]}", file=sys.stderr)
        raise
    finally:
        procs.stop_all(timeout=20)
        shutil.rmtree(logs, ignore_errors=True)


def bench_database(url: str) -> tuple[dict[str, str], "User", str]:
    """Migrate the database at `url`, set Django up on it here, and make the benchmark's user with a
    token: the environment for the processes to start (this one's, so bench/lib.py's UNCAPPED: the
    watchers are all one user's, beyond the default cap of streams per user), the user, the key."""
    env = {**os.environ, "DATABASE_URL": url, "PYTHONUNBUFFERED": "1"}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    os.environ["DATABASE_URL"] = url
    import django

    django.setup()
    from django.contrib.auth.models import User

    from tests.support.db import token_for

    user = User.objects.create_user(f"bench{int(time.time())}", password="bench")
    return env, user, token_for(user)


def postgres_facts() -> dict[str, str]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        version = cursor.fetchone()[0]
        cursor.execute("SHOW fsync")
        fsync = cursor.fetchone()[0]
    connection.close()
    return {"postgresql": version, "postgresql_fsync": fsync}
