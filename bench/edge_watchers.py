"""Benchmark: thousands of SSE watchers of one run through the edge (Pushpin, bin/edge), compared
with watchers of the same kind of run served by the web process itself.

    .venv/bin/python -m bench edge_watchers [--watchers 10000] [--direct-watchers 1000] [--events 100] [--interval 0.1]

How it works: docs/benchmarks.md#method-edge_watchers.
"""

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any, cast

from bench.lib import (
    RESULTS,
    CpuMeter,
    Sampler,
    bench_command,
    bench_database,
    durable_cluster,
    log,
    machine_facts,
    parse_sse,
    sse_request,
    summary,
)
from tests.support.procs import (
    ROOT,
    Proc,
    Procs,
    connections_to,
    descendants,
    free_port,
    group_members,
    proc_status,
    wait_log_line,
)
from tests.support.sse_writer import paced_command

WEB_APP_NAME = "bench-edge-web"
# Connects in flight per client process, as browsers arriving: all at once, thousands would wait
# past the bound on a stream's checks and be refused with 503 (the storm protection).
CONNECTS_IN_FLIGHT = 32
CONNECT_TRIES = 6
# Seconds the driver lets the streams end after the writer's last commit before it tells the
# clients to finish with what they have.
FINISH_SECONDS = 120
OPEN_FILES = 200_000
SAMPLE_SECONDS = 0.5


# --- a client process ----------------------------------------------------------------------------


class Watcher(asyncio.Protocol):
    """One stream: sends the request, records every read with its arrival time."""

    def __init__(self, request: bytes, connected: asyncio.Event, ended: asyncio.Future[None]) -> None:
        self.request = request
        self.connected = connected
        self.ended = ended
        self.chunks: list[tuple[float, bytes]] = []
        self.closed_at: float | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but write as one.
        cast(asyncio.WriteTransport, transport).write(self.request)

    def data_received(self, data: bytes) -> None:
        self.chunks.append((time.time(), data))
        # The first answer carries `retry:` once the stream is following the run.
        if not self.connected.is_set() and b"retry:" in data:
            self.connected.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed_at = time.time()
        self.connected.set()  # a refused one must not hold up the others' start
        if not self.ended.done():
            self.ended.set_result(None)


async def client_main(base: str, paths: list[str], token: str, out: Path) -> None:
    """Hold a stream of each of `paths`; print "ready" once all follow their run; when all have
    ended (or on SIGUSR1), write what they received to `out`, by path. A connect that is refused or
    answered other than 200 is tried again after a pause, as a browser's EventSource or the Python
    client would."""
    loop = asyncio.get_running_loop()
    finish = asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, finish.set)
    host, port = base.removeprefix("http://").split(":")
    gate = asyncio.Semaphore(CONNECTS_IN_FLIGHT)
    watchers: list[tuple[str, Watcher]] = []
    retries = 0
    refused: Counter[str] = Counter()

    async def connect(path: str) -> None:
        nonlocal retries
        for attempt in range(CONNECT_TRIES):
            connected, ended = asyncio.Event(), loop.create_future()
            watcher = Watcher(sse_request(base, path, token), connected, ended)
            async with gate:
                with contextlib.suppress(OSError, TimeoutError):
                    await loop.create_connection(lambda w=watcher: w, host, int(port))
                    await asyncio.wait_for(connected.wait(), 60)
            if watcher.chunks and watcher.chunks[0][1].startswith(b"HTTP/1.1 200") and not ended.done():
                break
            # Why it is tried again: the answer's status line, or how the connection ended.
            answer = b"".join(c for _, c in watcher.chunks)
            refused[answer.split(b"\r\n", 1)[0].decode(errors="replace") or "no answer"] += 1
            if answer.startswith(b"HTTP/1.1 200"):
                refused["200, then closed"] += 1
            if attempt < CONNECT_TRIES - 1:
                retries += 1
                await asyncio.sleep(0.5 * 2**attempt)  # the retry's backoff
        watchers.append((path, watcher))

    await asyncio.gather(*(connect(path) for path in paths))
    print("ready", flush=True)
    all_ended = asyncio.gather(*(w.ended for _, w in watchers))
    await asyncio.wait([all_ended, asyncio.ensure_future(finish.wait())], return_when=asyncio.FIRST_COMPLETED)
    # By path: the arrival times of each event, and how many watchers got events that were
    # exactly 1, 2, … n in order, ending with the terminal one (the driver knows n).
    received: dict[str, dict[int, list[float]]] = {}
    exact: dict[str, Counter[int]] = {}
    failures = []
    # The streams that ended short: (path, last seq received, when the connection closed, its last
    # bytes), to say when and how they ended.
    short: list[tuple[str, int, float | None, str]] = []
    for path, watcher in watchers:
        head = b"".join(c for _, c in watcher.chunks[:2])[:12]
        if not head.startswith(b"HTTP/1.1 200"):
            failures.append(head.decode(errors="replace") or "no answer")
            continue
        if not watcher.ended.done():
            failures.append("still open when told to finish")
        events = parse_sse(watcher.chunks)
        seqs = [e.seq for e in events]
        if events and seqs == list(range(1, len(seqs) + 1)) and events[-1].event == "run.completed":
            exact.setdefault(path, Counter())[len(seqs)] += 1
        else:
            failures.append(f"got {len(seqs)} events, first {seqs[:3]}, last {seqs[-3:]}")
            tail = b"".join(c for _, c in watcher.chunks)[-120:].decode(errors="replace")
            short.append((path, seqs[-1] if seqs else 0, watcher.closed_at, tail))
        for event in events:
            received.setdefault(path, {}).setdefault(event.seq, []).append(event.received_at)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out.write_text(
        json.dumps(
            {
                "exact": exact,
                "failed": len(failures),
                "failures": failures[:10],
                "short": short,
                "received": received,
                "cpu_seconds": usage.ru_utime + usage.ru_stime,
                "connect_retries": retries,
                "connects_refused": refused,
            }
        )
    )


# --- the driver ----------------------------------------------------------------------------------


def start_clients(
    name: str, base: str, shares: list[list[str]], token: str, env: dict[str, str], work: Path
) -> tuple[list[tuple["subprocess.Popen[str]", Path]], float]:
    """A client process (`--client`) per share of the watchers' paths, each writing what it got to
    a file of `work`; once every one holds all its streams: the processes with their files, and
    the seconds that took."""
    client_procs = []
    t0 = time.monotonic()
    for i, paths in enumerate(shares):
        out = work / f"{name}-client-{i}.json"
        paths_file = work / f"{name}-paths-{i}.json"
        paths_file.write_text(json.dumps(paths))
        args = bench_command("edge_watchers", "--client", base, str(paths_file), token, str(out))
        client_procs.append((subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True), out))
    for popen, _ in client_procs:
        assert popen.stdout is not None
        line = popen.stdout.readline().strip()
        assert line == "ready", f"a client process said {line!r}"
    connect_seconds = time.monotonic() - t0
    log(f"{name}: all connected in {connect_seconds:.1f} s")
    return client_procs, connect_seconds


def raise_open_files() -> None:
    """Room for every socket here and in the processes started from here (the machine runs as
    root, which may raise the hard limit)."""
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


def rss_and_threads(pids: list[int]) -> dict[str, int]:
    totals = {"rss_kb": 0, "threads": 0, "processes": 0}
    for pid in pids:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            status = proc_status(pid)
            totals["rss_kb"] += status["rss_kb"]
            totals["threads"] += status["threads"]
            totals["processes"] += 1
    return totals


def web_pids(web: Proc, processes: int) -> list[int]:
    return [web.pid] if processes == 1 else [p for p in group_members(web.pid) if p != web.pid]


def pushpin_pids(edge: Proc) -> list[int]:
    # bin/edge (manage.py runedge) runs Pushpin's runner, which runs its parts.
    return [edge.pid, *descendants(edge.pid)]


def run_phase(
    *,
    name: str,
    base: str,
    watchers: int,
    clients: int,
    token: str,
    run: Any,
    env: dict[str, str],
    events: int,
    interval: float,
    web: Proc,
    web_processes: int,
    edge: Proc | None,
    work: Path,
) -> dict[str, Any]:
    from tests.support.db import connections_named

    log(f"{name}: {watchers} watchers through {base} from {clients} client processes")
    path = f"/api/runs/{run.pk}/stream/?after_seq=0"
    web_port = int(web.url.rsplit(":", 1)[1])
    shares = [[path] * (watchers // clients + (i < watchers % clients)) for i in range(clients)]
    client_procs, connect_seconds = start_clients(name, base, shares, token, env, work)
    # The connect burst settles: the connections Pushpin opened to the web process for the
    # connects idle out (uvicorn closes a keep-alive connection after 5 s without a request).
    settle_until = time.monotonic() + 15
    while time.monotonic() < settle_until and connections_to(web_port) > (watchers if edge is None else 4):
        time.sleep(0.5)  # polling a count against the deadline above
    # A quiet second before the idle sample, so it is not taken in the tail of the connect burst
    # (a measurement's baseline, not synchronisation: nothing waits on it).
    time.sleep(1)

    def web_status() -> dict[str, int]:
        return rss_and_threads(web_pids(web, web_processes))

    def state() -> dict[str, Any]:
        found: dict[str, Any] = {
            "web": {**web_status(), "connections": connections_to(web_port)},
            "web_db_connections": connections_named(WEB_APP_NAME),
        }
        if edge is not None:
            assert edge.port is not None
            found["pushpin"] = {**rss_and_threads(pushpin_pids(edge)), "connections": connections_to(edge.port)}
        return found

    idle = state()
    # Each look parses /proc/net/tcp, tens of thousands of lines with the watchers connected: a
    # few looks a second, or the measuring would take a good part of a core from the measured.
    web_sampler = Sampler(web.pid, lambda: connections_to(web_port), interval=SAMPLE_SECONDS, status=web_status)
    samplers = [web_sampler]
    if edge is not None:
        assert edge.port is not None
        edge_port = edge.port
        samplers.append(
            Sampler(
                edge.pid,
                lambda: connections_to(edge_port),
                interval=SAMPLE_SECONDS,
                status=lambda: rss_and_threads(pushpin_pids(edge)),
            )
        )
    for sampler in samplers:
        sampler.start()
    pids = {f"web{i}": pid for i, pid in enumerate(web_pids(web, web_processes))}
    if edge is not None:
        pids.update({f"pushpin{i}": pid for i, pid in enumerate(pushpin_pids(edge))})
    cpu = CpuMeter(pids)
    writer = subprocess.run(
        paced_command(run.pk, run.generation, count=events, interval=interval),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    committed = {int(s): float(t) for s, t in (line.split() for line in writer.stdout.splitlines())}
    finish_by = time.monotonic() + FINISH_SECONDS
    for popen, _ in client_procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=max(0.1, finish_by - time.monotonic()))
    used = cpu.stop()
    for popen, _ in client_procs:
        if popen.poll() is None:
            popen.send_signal(signal.SIGUSR1)
        popen.wait(timeout=300)
    # Pushpin's parts and the web processes, each added up.
    cores: Counter[str] = Counter()
    for who, value in used["process_cores"].items():
        cores[who.rstrip("0123456789")] += value
    used["process_cores"] = {who: round(value, 2) for who, value in cores.items()}
    for sampler in samplers:
        sampler.stop_event.set()
        sampler.join()
    delays: list[float] = []
    exact: Counter[int] = Counter()
    failures: list[str] = []
    client_cpu = 0.0
    connect_retries = failed = 0
    for popen, out in client_procs:
        assert popen.returncode == 0, f"a client process exited with {popen.returncode}"
        result = json.loads(out.read_text())
        client_cpu += result["cpu_seconds"]
        connect_retries += result["connect_retries"]
        exact.update({int(k): v for k, v in result["exact"].get(path, {}).items()})
        failures += result["failures"]
        failed += result["failed"]
        for seq, times in result["received"].get(path, {}).items():
            if int(seq) in committed:
                delays += [(t - committed[int(seq)]) * 1000 for t in times]
    last_seq = max(committed)  # the terminal event's
    peaks = {"web": web_sampler.peak} | ({"pushpin": samplers[1].peak} if edge is not None else {})
    report = {
        "watchers": watchers,
        "watchers_with_every_event_once_in_order": exact[last_seq],
        "last_seq": last_seq,
        "failed_watchers": failed,
        "failures": failures[:10],
        "connect_all_seconds": round(connect_seconds, 1),
        "connect_retries": connect_retries,
        "delay_ms": summary(delays),
        "idle_with_watchers": idle,
        # Sampler calls what it counts db_connections; here it is the process's TCP connections.
        "peak_during_burst": {
            who: {"rss_kb": peak["rss_kb"], "threads": peak["threads"], "connections": peak["db_connections"]}
            for who, peak in peaks.items()
        },
        "cpu_during_burst": used,
        "client_cpu_seconds_all_along": round(client_cpu, 1),
        # What the publisher had to say (a publish refused, Pushpin recovered), if anything.
        "publisher_log": [line for line in web.log().splitlines() if "edge publish" in line][:20],
    }
    log(f"{name}: p50 {report['delay_ms'].get('p50')} ms, p99 {report['delay_ms'].get('p99')} ms")
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--watchers", type=int, default=10_000, help="through the edge")
    parser.add_argument("--direct-watchers", type=int, default=1_000, help="on the web process itself (0: skip)")
    parser.add_argument("--events", type=int, default=100)
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between the writer's commits")
    parser.add_argument("--clients", type=int, default=4, help="client processes holding the watchers")
    parser.add_argument("--web-processes", type=int, default=1, help="uvicorn --workers N behind the edge")
    parser.add_argument("--database-url", help="an existing, empty PostgreSQL database instead of a new cluster")
    parser.add_argument("--client", nargs=4, metavar=("BASE", "PATHS", "TOKEN", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        import uvloop

        base, paths_file, token, out = args.client
        uvloop.run(client_main(base, json.loads(Path(paths_file).read_text()), token, Path(out)))
        return 0

    raise_open_files()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    machine = machine_facts(idle_seconds=2)
    with ExitStack() as stack:
        url = args.database_url or stack.enter_context(durable_cluster()).url
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="runledger-bench-edge-")))
        procs = Procs(work)
        stack.callback(procs.stop_all, timeout=20)
        env, user, token = bench_database(url)
        from runs import services

        def claimed_run() -> Any:
            run = services.run_create(owner=user, agent="demo", input={"bench": True})
            claimed = services.run_claim(worker="bench")
            assert claimed is not None and claimed[0].pk == run.pk
            return claimed[0]

        web_env = {**env, "DATABASE_URL": f"{url}?application_name={WEB_APP_NAME}"}
        phases: dict[str, Any] = {}

        def same() -> dict[str, Any]:
            """What both phases share: the clients, the writer, a fresh run each."""
            return {
                "clients": args.clients,
                "token": token,
                "run": claimed_run(),
                "env": env,
                "events": args.events,
                "interval": args.interval,
                "work": work,
            }

        if args.direct_watchers:
            web = procs.uvicorn(env=web_env, timeout=60)
            phases["direct"] = run_phase(
                name="direct",
                base=web.url,
                watchers=args.direct_watchers,
                web=web,
                web_processes=1,
                edge=None,
                **same(),
            )
            web.stop(timeout=20)

        # Pushpin's control socket, in a folder of this run's only this user may enter.
        control = work / "edge-control" / "control"
        web = procs.uvicorn(
            env={**web_env, "RUNLEDGER_GRIP_URL": f"ipc://{control}"},
            workers=args.web_processes,
            timeout=60,
        )
        port = free_port()
        edge_args = [str(ROOT / "bin" / "edge"), "--port", f"127.0.0.1:{port}", "--control", str(control)]
        # Warnings only: Pushpin logs every request and publish at its default level.
        edge_args += ["--upstream", f"127.0.0.1:{web.port}", "--log-level", os.environ.get("BENCH_EDGE_LOG_LEVEL", "1")]
        edge = procs.start("edge", edge_args, {**env, "PYTHON": sys.executable}, port=port)
        wait_log_line(edge, "Pushpin ready", timeout=60)
        phases["edge"] = run_phase(
            name="edge",
            base=edge.url,
            watchers=args.watchers,
            web=web,
            web_processes=args.web_processes,
            edge=edge,
            **same(),
        )

    report = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine,
        "events": args.events,
        "interval_seconds": args.interval,
        "client_processes": args.clients,
        "web_processes_behind_the_edge": args.web_processes,
        "phases": phases,
    }
    print_table(report)
    return write_report("edge_watchers", report)


def write_report(name: str, report: dict[str, Any]) -> int:
    """The report as JSON in bench/results/; the exit status: 0 when every phase's watchers all got
    every event once, in order."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    out_path = RESULTS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out_path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nJSON: {out_path}")
    phases = report["phases"].values()
    return 0 if all(p["watchers_with_every_event_once_in_order"] == p["watchers"] for p in phases) else 1


def print_table(r: dict[str, Any]) -> None:
    print(f"\nmachine: {r['machine']['nproc']} cores of {r['machine']['cpu']}, {r['machine']['memory_gib']} GiB")
    print(
        f"{r['events']} events, one commit each, {r['interval_seconds']} s apart; {r['client_processes']} client processes"
    )
    for name, p in r["phases"].items():
        d, idle, peak = p["delay_ms"], p["idle_with_watchers"], p["peak_during_burst"]
        rows = [
            ("watchers (one run)", f"{p['watchers']}"),
            ("got every event once, in order", f"{p['watchers_with_every_event_once_in_order']}"),
            ("time to connect all (connects tried again)", f"{p['connect_all_seconds']} s ({p['connect_retries']})"),
            ("commit -> delivery p50 / p99 / max", f"{d.get('p50')} / {d.get('p99')} / {d.get('max')} ms"),
            (
                "web RSS idle / peak, connections idle / peak",
                f"{idle['web']['rss_kb'] / 1024:.0f} / {peak['web']['rss_kb'] / 1024:.0f} MB, "
                f"{idle['web']['connections']} / {peak['web']['connections']}",
            ),
            ("web DB connections idle", f"{idle['web_db_connections']}"),
            (
                "CPU during the burst: machine busy, cores used",
                f"{p['cpu_during_burst']['machine_cpu_busy_pct']} %, "
                + ", ".join(f"{k} {v}" for k, v in p["cpu_during_burst"]["process_cores"].items()),
            ),
            ("client processes' CPU, connects included", f"{p['client_cpu_seconds_all_along']} s"),
        ]
        if "pushpin" in idle:
            rows.append(
                (
                    "Pushpin RSS idle / peak, client connections idle / peak",
                    f"{idle['pushpin']['rss_kb'] / 1024:.0f} / {peak['pushpin']['rss_kb'] / 1024:.0f} MB, "
                    f"{idle['pushpin']['connections']} / {peak['pushpin']['connections']}",
                )
            )
        print(f"\n== {name}")
        width = max(len(k) for k, _ in rows)
        for key, value in rows:
            print(f"{key:<{width}}  {value}")
