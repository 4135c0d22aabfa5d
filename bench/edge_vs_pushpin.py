"""Benchmark: the edge's cost against Pushpin's own, the same watchers and events both ways.

    .venv/bin/python -m bench edge_vs_pushpin [--runs 100] [--per-run 100] [--interval 2] [--clients 4]

How it works: docs/benchmarks.md#method-edge_vs_pushpin.
"""

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.edge_watchers import pushpin_pids, raise_open_files, start_clients, web_pids, write_report
from bench.lib import RESULTS, CpuMeter, bench_command, bench_database, durable_cluster, log, machine_facts, summary
from bench.profile import top
from runs.conf import AppSettings
from tests.support.procs import ROOT, Proc, Procs, free_port, wait_log_line

WEB_APP_NAME = "bench-edge-web"
SERIES_SECONDS = 10
# Seconds the driver lets the streams end after the last event before telling the clients to
# finish with what they have.
FINISH_SECONDS = 120
# The JSON of an output.delta event as Runledger stores it, for frames of the same size in phase 1.
DELTA_TYPE = "output.delta"


def schedule(runs: int, events: int, interval: float) -> list[tuple[float, int, int]]:
    """(offset seconds, run index, event index) of every event: each run every `interval`, the
    runs spread evenly over it."""
    return sorted((k * interval + r * interval / runs, r, k) for k in range(events) for r in range(runs))


def paced(plan: list[tuple[float, int, int]]) -> Any:
    """The plan's steps, each yielded at its time (the load's shape, not synchronisation)."""
    start = time.monotonic()
    for at, r, k in plan:
        time.sleep(max(0.0, start + at - time.monotonic()))
        yield r, k


# --- phase 1: a plain GRIP origin and a publisher ---------------------------------------------------


# The holds the phase-1 origin can give (`--direct-hold`), to tell what in Runledger's hold costs
# Pushpin more per delivery: "plain" is the run's channel alone, fetched only after a gap; "link"
# adds a per-stream link token as a never-published channel's previous id, "user" a channel shared
# by every stream of the user, "channels" both; "timeout" adds a link timeout (fetched every
# RUNLEDGER_GRIP_LINK_SECONDS, the first after RUNLEDGER_GRIP_LINK_FIRST_SECONDS, each x1-1.5, as
# Runledger's, over its few values; "fine": over a value per second, as before); "runledger" all three.
# Parts join with "+" ("link+timeout", "runledger+fine").
DIRECT_HOLDS = ("plain", "user", "link", "channels", "timeout", "fine", "runledger")
HOLD_PARTS = {
    "plain": set(),
    "channels": {"user", "link"},
    "fine": {"timeout", "fine"},
    "runledger": {"user", "link", "timeout"},
}


def hold_parts(hold: str) -> set[str]:
    """The parts of a `--direct-hold` ("user", "link", "timeout")."""
    parts: set[str] = set()
    for name in hold.split("+"):
        if name not in DIRECT_HOLDS:
            raise argparse.ArgumentTypeError(f"--direct-hold: {name!r} is none of {', '.join(DIRECT_HOLDS)}")
        parts |= HOLD_PARTS.get(name, {name})
    return parts


def origin_main(port: int, hold: str = "plain", first: int = 0, every: int = 0) -> int:
    """An HTTP/1.1 server (keep-alive) that holds every GET /runs/<n>/ on channel `run-<n>` at id 0.

    Pushpin takes a previous id only with a next link (without it, it ends the stream): with
    `hold` "plain" or "channels" the link is given without a timeout, so Pushpin fetches it only
    after a gap (none, unless an item is lost); any fetch is held again at the id Pushpin has,
    with nothing to send (the items published meanwhile wait in Pushpin's queue of the stream)."""
    import django

    django.setup()
    from runs.streaming.edge.grip import spread

    parts = hold_parts(hold)
    timed = "timeout" in parts

    def timeout(seconds: int) -> str:
        if not timed:
            return ""
        # "fine": the spread Runledger gave before 2026-12-03, a value per second.
        return f"; timeout={seconds + random.randrange(seconds // 2 + 1) if 'fine' in parts else spread(seconds)}"

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                path = head.split(" ", 2)[1]
                run = path.strip("/").split("/")[1]
                last = re.search(rf"run-{run}; last-id=(\d+)", head)
                body = b"" if last else b"retry: 3000\n\n"
                held = f"run-{run}; prev-id={last[1] if last else 0}"
                if "link" in parts:
                    token = re.search(r"runledger-link; last-id=([\w-]+)", head)
                    held += f", runledger-link; prev-id={token[1] if token else secrets.token_urlsafe(86)}"
                if "user" in parts:
                    held += ", runledger-user-1"
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                    + f"Grip-Hold: stream\r\nGrip-Channel: {held}\r\n".encode()
                    + f"Grip-Link: </runs/{run}/next/>; rel=next{timeout(every if last else first)}\r\n".encode()
                    + b"Grip-Keep-Alive: : keep-alive\\n\\n; format=cstring; timeout=15\r\n"
                    + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )
                await writer.drain()

    async def main() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", port, backlog=4096)
        print("listening", flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(main())
    return 0


def frame(seq: int, event: str, body: dict[str, Any]) -> str:
    """An SSE frame as Runledger writes one (runs.streaming.hub.make_frame, compact JSON)."""
    return f"event: {event}\ndata: {json.dumps(body, separators=(',', ':'))}\nid: {seq}\n\n"


def iso(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1e6):06d}Z"


def publisher_main(control: str, runs: int, events: int, interval: float) -> int:
    """Publish `events` output.delta events to each run's channel, then a run.completed and a close,
    one request per event answered before the next; print `run seq published_at` for each."""
    import zmq

    # ZRPC's encoding only (a pure function): the requests are this publisher's own.
    from runs.streaming.edge.control import parse_tnetstring, tnetstring

    sock = zmq.Context().socket(zmq.DEALER)
    sock.connect(control)
    ids = itertools.count()

    def publish(items: list[dict[str, Any]]) -> None:
        request_id = str(next(ids))
        sock.send_multipart([b"", tnetstring({"id": request_id, "method": "publish", "args": {"items": items}})])
        answer, _ = parse_tnetstring(sock.recv_multipart()[-1])
        assert answer["id"] == request_id.encode() and answer["success"] is True, answer

    for r, k in paced(schedule(runs, events + 1, interval)):
        name, seq, at = f"run-{r}", k + 1, time.time()
        kind, data = (DELTA_TYPE, {"text": f"delta {k}"}) if k < events else ("run.completed", {})
        text = frame(seq, kind, {"seq": seq, "type": kind, "data": data, "created_at": iso(at), "attempt": 1})
        items = [
            {"channel": name, "id": str(seq), "prev-id": str(seq - 1), "formats": {"http-stream": {"content": text}}}
        ]
        if k == events:
            items.append({"channel": name, "prev-id": str(seq), "formats": {"http-stream": {"action": "close"}}})
        publish(items)
        print(r, seq, repr(at), flush=True)
    return 0


# --- phase 2: the writer -----------------------------------------------------------------------------


def writer_main(runs_file: str, events: int, interval: float) -> int:
    """Append `events` events to each run (one per transaction, on the same plan as the
    publisher), then complete it; print `run-index seq committed_at` after each commit."""
    import django

    django.setup()
    from runs import services
    from runs.events import EventType

    runs = json.loads(Path(runs_file).read_text())
    for r, k in paced(schedule(len(runs), events + 1, interval)):
        run_id, generation = runs[r]
        if k < events:
            rows = services.run_events_append(
                run_id=run_id, generation=generation, events=[(EventType.OUTPUT_DELTA, {"text": f"delta {k}"})]
            )
            seq = rows[-1].seq
        else:
            seq = services.run_complete(run_id=run_id, generation=generation, output={"deltas": events}).last_seq
        print(r, seq, repr(time.time()), flush=True)  # returned = committed
    return 0


# --- the driver --------------------------------------------------------------------------------------


class CpuSeries(threading.Thread):
    """The cores each of `pids` used in every `every` seconds until `stop_event`, by process name."""

    def __init__(self, pids: dict[str, int], names: dict[str, str], every: float) -> None:
        super().__init__(daemon=True)
        self.meter, self.names, self.every = CpuMeter(pids), names, every
        self.stop_event = threading.Event()
        self.found: dict[str, list[float]] = {}

    def run(self) -> None:
        while not self.stop_event.wait(self.every):
            used = self.meter.stop()["process_seconds"]
            self.meter = CpuMeter(self.meter.pids)
            total: Counter[str] = Counter()
            for key, seconds in used.items():
                total[f"{key.rstrip('0123456789')}: {self.names[key]}"] += seconds
            for name, seconds in total.items():
                if seconds > 0.5 or name in self.found:
                    self.found.setdefault(name, []).append(round(seconds / self.every, 2))


def comm(pid: int) -> str:
    """A process's name (the kernel's, 15 characters)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def backend_pids(names: tuple[str, ...]) -> list[int]:
    """PostgreSQL backends whose application_name starts with any of `names`."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE " + " OR ".join(["application_name LIKE %s"] * len(names)),
            [f"{n}%" for n in names],
        )
        found = [row[0] for row in cursor.fetchall()]
    connection.close()
    return found


def requests_answered(base: str, token: str) -> int:
    """Every HTTP request the web processes answered so far (runledger_http_requests_total), this
    scrape's own included."""
    request = urllib.request.Request(f"{base}/metrics/", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        lines = answer.read().decode().splitlines()
    return round(
        sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("runledger_http_requests_total{"))
    )


def web_watch(base: str, token: str, pid: int, profile: Path | None) -> Callable[[], Callable[[], dict[str, Any]]]:
    """Over the window: the requests the web processes answered (with no client connecting, the
    link fetches), and with `profile`, py-spy's samples of the web process `pid` (not pausing it)."""

    def start() -> Callable[[], dict[str, Any]]:
        before = requests_answered(base, token)
        spy = None
        if profile is not None:
            cmd = [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid), "--rate", "100"]
            cmd += ["--format", "raw", "--output", str(profile), "--threads", "--nonblocking"]
            spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

        def stop() -> dict[str, Any]:
            found: dict[str, Any] = {"web_requests_during_window": requests_answered(base, token) - before - 1}
            if spy is not None and profile is not None:
                spy.send_signal(signal.SIGINT)
                spy.communicate(timeout=120)
                found["profile"] = top(profile, 30)
            return found

        return stop

    return start


def run_phase(
    *,
    name: str,
    base: str,
    paths: list[str],
    token: str,
    clients: int,
    env: dict[str, str],
    emitter: list[str],
    counted: dict[str, list[int]],
    backends: tuple[str, ...],
    work: Path,
    settle: float,
    watch: Callable[[], Callable[[], dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """Connect the watchers of `paths` (one each), then run `emitter` (prints `run seq time`
    per event) under the CPU meter of `counted`'s processes (and of the PostgreSQL backends named
    `backends`, looked up once the emitter runs). `watch` starts something else to look at over
    the same window and returns what stops it, which returns what it found."""
    log(f"{name}: {len(paths)} watchers through {base} from {clients} client processes")
    shares = [paths[i::clients] for i in range(clients)]
    client_procs, connect_seconds = start_clients(name, base, shares, token, env, work)
    time.sleep(settle)  # the connect burst's tail settles before the meter starts (a baseline, not a wait)
    emitting = subprocess.Popen(emitter, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    pids = {f"{who}{i}": pid for who, found in counted.items() for i, pid in enumerate(found)}
    # The backends connect with the emitter's first event (LISTEN is older); looked up at once.
    pids.update({f"postgres{i}": pid for i, pid in enumerate(backend_pids(backends))} if backends else {})
    names = {key: comm(pid) for key, pid in pids.items()}
    cpu = CpuMeter(pids)
    series = CpuSeries(pids, names, SERIES_SECONDS)
    series.start()
    stop_watching = watch() if watch else None
    started, started_wall = time.monotonic(), time.time()
    out, _ = emitting.communicate()
    assert emitting.returncode == 0, f"the emitter exited with {emitting.returncode}"
    emitted_seconds = time.monotonic() - started
    emitted = {(int(r), int(s)): float(t) for r, s, t in (line.split() for line in out.splitlines())}
    finish_by = time.monotonic() + FINISH_SECONDS
    for popen, _ in client_procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=max(0.1, finish_by - time.monotonic()))
    metered_seconds = time.monotonic() - started
    used = cpu.stop()
    series.stop_event.set()
    series.join()
    watched = stop_watching() if stop_watching else {}
    for popen, _ in client_procs:
        if popen.poll() is None:
            popen.send_signal(signal.SIGUSR1)
        popen.wait(timeout=300)
    run_of = {path: r for r, path in enumerate(dict.fromkeys(paths))}
    last_seq = {r: max(s for (rr, s) in emitted if rr == r) for r in set(r for r, _ in emitted)}
    delays: list[float] = []
    complete = failed = deliveries = retries = 0
    refused: Counter[str] = Counter()
    failures: list[str] = []
    short: list[tuple[str, int, float | None, str]] = []
    for popen, result_file in client_procs:
        assert popen.returncode == 0, f"a client process exited with {popen.returncode}"
        result = json.loads(result_file.read_text())
        retries += result["connect_retries"]
        refused.update(result["connects_refused"])
        failed += result["failed"]
        failures += result["failures"]
        short += [
            (path, last, None if closed is None else round(closed - started_wall, 1), tail)
            for path, last, closed, tail in result["short"]
        ]
        for path, lengths in result["exact"].items():
            complete += lengths.get(str(last_seq[run_of[path]]), 0)
        for path, by_seq in result["received"].items():
            r = run_of[path]
            for seq, times in by_seq.items():
                if (r, int(seq)) in emitted:
                    deliveries += len(times)
                    delays += [(t - emitted[(r, int(seq))]) * 1000 for t in times]
    seconds = {who: 0.0 for who in counted} | ({"postgres": 0.0} if backends else {})
    parts: Counter[str] = Counter()
    for key, used_seconds in used["process_seconds"].items():
        who = key.rstrip("0123456789")
        seconds[who] += used_seconds
        parts[f"{who}: {names[key]}"] += used_seconds
    report = {
        "watchers": len(paths),
        "watchers_with_every_event_once_in_order": complete,
        "failed_watchers": failed,
        "failures": failures[:10],
        # The streams that ended short: (path, last seq, seconds from the first event to their
        # close, their last bytes).
        "short_streams": short,
        "connect_all_seconds": round(connect_seconds, 1),
        "connect_retries": retries,
        "connects_refused": dict(refused),
        "events_emitted": len(emitted),
        "emitting_seconds": round(emitted_seconds, 1),
        "metered_seconds": round(metered_seconds, 1),
        "deliveries": deliveries,
        "cpu_seconds": {who: round(s, 2) for who, s in seconds.items()},
        "us_per_delivery": {who: round(s / max(deliveries, 1) * 1e6, 1) for who, s in seconds.items()},
        "cpu_seconds_by_process": {part: round(s, 2) for part, s in parts.most_common()},
        # Cores each busy process used in each SERIES_SECONDS of the window: a constant cost or a tail.
        "cores_every_10_s": series.found,
        **watched,
        "machine_cpu_busy_pct": used["machine_cpu_busy_pct"],
        "delay_ms": summary(delays),
    }
    log(f"{name}: {deliveries} deliveries, CPU {report['cpu_seconds']}, p99 {report['delay_ms'].get('p99')} ms")
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--per-run", type=int, default=100, help="watchers of each run")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between two events of a run")
    parser.add_argument("--pushpin-seconds", type=float, default=60, help="phase 1's events last this long")
    parser.add_argument("--edge-seconds", type=float, help="phase 2's (default 1.25 x the link timeout)")
    parser.add_argument("--clients", type=int, default=4, help="client processes holding the watchers")
    parser.add_argument("--settle", type=float, default=5, help="seconds after the connects before the meter starts")
    parser.add_argument("--web-processes", type=int, default=1, help="uvicorn --workers N behind the edge")
    parser.add_argument("--profile", action="store_true", help="py-spy on the web process in phase 2 (a diagnosis)")
    parser.add_argument("--edge-log-level", type=int, default=1, help="Pushpin's (3: debug, a diagnosis)")
    parser.add_argument("--keep-logs", type=Path, help="copy every process's log here at the end (a diagnosis)")
    parser.add_argument(
        "--direct-hold", default="plain", help="the phase-1 origin's hold, parts joined by + (a diagnosis)"
    )
    parser.add_argument("--direct-only", action="store_true", help="phase 1 only (a diagnosis)")
    parser.add_argument("--origin", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--publisher", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--writer", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    try:
        hold_parts(args.direct_hold)
    except argparse.ArgumentTypeError as error:
        parser.error(str(error))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    if args.origin:
        port, hold, first, every = args.origin
        return origin_main(int(port), hold, int(first), int(every))
    if args.publisher:
        control, runs, events, interval = args.publisher
        return publisher_main(control, int(runs), int(events), float(interval))
    if args.writer:
        runs_file, events, interval = args.writer
        return writer_main(runs_file, int(events), float(interval))

    raise_open_files()
    machine = machine_facts(idle_seconds=2)
    RESULTS.mkdir(parents=True, exist_ok=True)
    # The web process's own reading of them (the environment, else the defaults).
    link_seconds = int(os.environ.get("RUNLEDGER_GRIP_LINK_SECONDS", AppSettings.GRIP_LINK_SECONDS.default))
    first_seconds = int(
        os.environ.get("RUNLEDGER_GRIP_LINK_FIRST_SECONDS", AppSettings.GRIP_LINK_FIRST_SECONDS.default)
    )
    edge_seconds = args.edge_seconds or 1.25 * link_seconds
    events = {"pushpin": round(args.pushpin_seconds / args.interval), "edge": round(edge_seconds / args.interval)}
    with ExitStack() as stack:
        url = stack.enter_context(durable_cluster()).url
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="runledger-bench-evp-")))
        procs = Procs(work)
        if args.keep_logs:
            # Not the control sockets (a socket is no file to copy).
            stack.callback(
                shutil.copytree, work, args.keep_logs, ignore=shutil.ignore_patterns("control"), dirs_exist_ok=True
            )
        stack.callback(procs.stop_all, timeout=20)
        env, user, token = bench_database(url)
        phases: dict[str, Any] = {}

        def start_edge(upstream: int, control: Path) -> Proc:
            port = free_port()
            edge_args = [str(ROOT / "bin" / "edge"), "--port", f"127.0.0.1:{port}", "--control", str(control)]
            # Warnings only by default: at its own default level Pushpin logs every request and publish.
            edge_args += ["--upstream", f"127.0.0.1:{upstream}", "--log-level", str(args.edge_log_level)]
            edge = procs.start(f"edge-{control.parent.name}", edge_args, {**env, "PYTHON": sys.executable}, port=port)
            wait_log_line(edge, "Pushpin ready", timeout=60)
            return edge

        # Phase 1: Pushpin alone.
        origin_port = free_port()
        origin_args = [str(origin_port), args.direct_hold, str(first_seconds), str(link_seconds)]
        origin = procs.start(
            "origin", bench_command("edge_vs_pushpin", "--origin", *origin_args), env, port=origin_port
        )
        wait_log_line(origin, "listening", timeout=30)
        control = work / "pushpin-control" / "control"
        edge = start_edge(origin_port, control)
        paths = [f"/runs/{r}/" for r in range(args.runs) for _ in range(args.per_run)]
        publisher = bench_command("edge_vs_pushpin", "--publisher", f"ipc://{control}", str(args.runs))
        shared = {"token": token, "clients": args.clients, "env": env, "work": work, "settle": args.settle}
        phases["pushpin"] = run_phase(
            name="pushpin",
            base=edge.url,
            paths=paths,
            emitter=[*publisher, str(events["pushpin"]), str(args.interval)],
            counted={"pushpin": pushpin_pids(edge)},
            backends=(),
            **shared,
        )
        edge.stop(timeout=20)
        origin.stop(timeout=10)
        if args.direct_only:
            phase = phases["pushpin"]
            log(
                f"direct ({args.direct_hold} hold): {phase['us_per_delivery']} µs per delivery, {phase['cpu_seconds_by_process']}"
            )
            return write_report("edge_vs_pushpin_direct", {"direct_hold": args.direct_hold, "phases": phases})

        # Phase 2: through Runledger.
        from runs import services

        runs = []
        for _ in range(args.runs):
            services.run_create(owner=user, agent="demo", input={"bench": True})
            claimed = services.run_claim(worker="bench")
            assert claimed is not None
            runs.append((str(claimed[0].pk), claimed[0].generation))
        runs_file = work / "runs.json"
        runs_file.write_text(json.dumps(runs))
        control = work / "edge-control" / "control"
        metrics_token = secrets.token_hex(16)
        web = procs.uvicorn(
            env={
                **env,
                "DATABASE_URL": f"{url}?application_name={WEB_APP_NAME}",
                "RUNLEDGER_GRIP_URL": f"ipc://{control}",
                "RUNLEDGER_METRICS_TOKEN": metrics_token,
            },
            workers=args.web_processes,
            timeout=60,
        )
        edge = start_edge(int(web.port or 0), control)
        paths = [f"/api/runs/{run_id}/stream/?after_seq=0" for run_id, _ in runs for _ in range(args.per_run)]
        phases["edge"] = run_phase(
            name="edge",
            base=edge.url,
            paths=paths,
            emitter=bench_command(
                "edge_vs_pushpin", "--writer", str(runs_file), str(events["edge"]), str(args.interval)
            ),
            counted={"pushpin": pushpin_pids(edge), "web": web_pids(web, args.web_processes)},
            backends=(WEB_APP_NAME, "runledger-edge"),
            **shared,
            watch=web_watch(
                web.url, metrics_token, web.pid, RESULTS / "profile-edge-web.txt" if args.profile else None
            ),
        )

    direct = phases["pushpin"]["us_per_delivery"]["pushpin"]
    through = phases["edge"]["us_per_delivery"]
    report = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine,
        "runs": args.runs,
        "watchers_per_run": args.per_run,
        "interval_seconds": args.interval,
        "link_seconds": link_seconds,
        "link_first_seconds": first_seconds,
        "direct_hold": args.direct_hold,
        "client_processes": args.clients,
        "web_processes": args.web_processes,
        "phases": phases,
        "ratio": round((through["pushpin"] + through["web"]) / direct, 3) if direct else None,
        "ratio_with_postgres": (
            round((through["pushpin"] + through["web"] + through["postgres"]) / direct, 3) if direct else None
        ),
    }
    print_table(report)
    return write_report("edge_vs_pushpin", report)


def print_table(r: dict[str, Any]) -> None:
    m = r["machine"]
    print(f"\nmachine: {m['nproc']} cores of {m['cpu']}, {m['memory_gib']} GiB; {r['when']}")
    print(
        f"{r['runs']} runs x {r['watchers_per_run']} watchers, an event per run every {r['interval_seconds']} s; "
        f"link timeout {r['link_seconds']} s (the first {r.get('link_first_seconds', '-')} s); "
        f"{r['client_processes']} client processes"
    )
    names = list(r["phases"])
    rows: list[tuple[str, ...]] = [("", *names)]

    def row(label: str, get: Any) -> None:
        rows.append((label, *(str(get(r["phases"][n])) for n in names)))

    row("watchers", lambda p: p["watchers"])
    row("got every event once, in order", lambda p: p["watchers_with_every_event_once_in_order"])
    row("connect all (retries)", lambda p: f"{p['connect_all_seconds']} s ({p['connect_retries']})")
    row("events emitted / metered s", lambda p: f"{p['events_emitted']} / {p['metered_seconds']}")
    row("deliveries", lambda p: p["deliveries"])
    for who in ("pushpin", "web", "postgres"):
        row(
            f"{who}: CPU s, µs/delivery",
            lambda p, w=who: f"{p['cpu_seconds'][w]}, {p['us_per_delivery'][w]}" if w in p["cpu_seconds"] else "-",
        )
    row("machine busy %", lambda p: p["machine_cpu_busy_pct"])
    row("web requests in the window (link fetches)", lambda p: p.get("web_requests_during_window", "-"))
    row(
        "emit → delivery p50/p99/max ms",
        lambda p: f"{p['delay_ms'].get('p50')} / {p['delay_ms'].get('p99')} / {p['delay_ms'].get('max')}",
    )
    widths = [max(len(line[i]) for line in rows) for i in range(len(rows[0]))]
    for line in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)))
    for name in names:
        parts = ", ".join(f"{part} {value}" for part, value in r["phases"][name]["cpu_seconds_by_process"].items())
        print(f"{name} CPU s by process: {parts}")
        for part, cores in r["phases"][name]["cores_every_10_s"].items():
            print(f"  {part}, cores every {SERIES_SECONDS} s: {' '.join(str(c) for c in cores)}")
    profile = r["phases"]["edge"].get("profile")
    if profile:
        # Its own samples only (the inclusive ones are in the JSON): where the web process's time goes.
        samples = profile["total"][0][1] or 1
        own = "; ".join(f"{frame_name[:90]} {100 * count / samples:.1f}%" for frame_name, count in profile["own"])
        print(f"\nweb process, own samples of {samples}: {own}")
    print(f"\n(Pushpin + web) ÷ Pushpin direct, per delivery: {r['ratio']}")
    print(f"(Pushpin + web + their PostgreSQL backends) ÷ Pushpin direct: {r['ratio_with_postgres']}")
