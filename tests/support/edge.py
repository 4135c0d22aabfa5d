"""Debian's Pushpin in front of web processes, started by `bin/edge` as an operator would; a tap on
its control socket that loses or refuses a chosen publish; and what an attacker of the edge would
use: a Grip-Sig Pushpin really signed, the TCP ports its parts listen on, a process of another user.
Then the edge tests' stack (web process, edge, worker), its watchers, what Pushpin's log says it
did, and requests made as Pushpin makes them (tests/edge/).

`bin/edge` (manage.py runedge) starts Pushpin's runner in a process group of its own, and the
runner starts its parts (condure, zurl, the proxy and the handler) each in one of their own: they
are recorded as the `Proc`'s companions, so stopping it by its PID also makes sure they are gone.
"""

import asyncio
import atexit
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jwt
import zmq
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from runs import services
from runs.events import EventType
from runs.models import Run
from runs.streaming.edge import grip
from runs.streaming.edge.control import parse_tnetstring, tnetstring
from tests.support.procs import (
    ROOT,
    Proc,
    Procs,
    descendants,
    free_port,
    process_gone,
    python_as,
    subprocess_env,
    wait_http_ok,
    wait_log_line,
)
from tests.support.raw_http import Trickled
from tests.support.runs import assert_exact_log, fresh
from tests.support.sse import Event, Stream, request_once, stream_path, watch
from tests.support.threads import in_thread
from tests.support.waiting import wait_until
from tests.support.workers import wait_status

# Pushpin fetches each held stream's link this often (the re-check, and the safety net of a lost publish).
LINK_SECONDS = "2"
# The folders of the control sockets made here, removed when the tests end.
_FOLDERS: list[str] = []
atexit.register(lambda: [shutil.rmtree(folder, ignore_errors=True) for folder in _FOLDERS])


def control_socket() -> str:
    """A new control URL, `ipc://…/control`, in a new folder only this user may enter (a short
    path: a Unix socket's address holds 107 bytes)."""
    folder = tempfile.mkdtemp(prefix="runledger-ctl-")
    _FOLDERS.append(folder)
    return f"ipc://{folder}/control"


def edge_env(control: str, **extra: str) -> dict[str, str]:
    """A web process behind the edge whose control socket is `control` (`extra` wins)."""
    grip = {"RUNLEDGER_GRIP_URL": control, "RUNLEDGER_GRIP_LINK_SECONDS": LINK_SECONDS}
    return subprocess_env(**{**grip, **extra})


def wait_leading(web: Proc, timeout: float = 20) -> None:
    """Until the web process's publisher leads (it logs it)."""
    wait_log_line(web, "edge publisher", timeout=timeout)
    wait_log_line(web, " leads: ", timeout=timeout)


@dataclass
class Edge:
    proc: Proc
    control: str  # the control socket's URL (ipc://…)
    url: str  # bin/edge's client side: where clients connect (http://127.0.0.1:PORT, or unix:PATH)

    def log(self) -> str:
        return self.proc.log()

    def parts_alive(self) -> list[int]:
        return [pid for pid in self.proc.companions if not process_gone(pid)]

    def stop(self) -> int | None:
        """SIGTERM to bin/edge's PID (Pushpin's runner): its exit status (SIGKILL after 15 s, and
        for any part left behind)."""
        return self.proc.stop(timeout=15)


def start_edge(
    procs: Procs, *, upstream: Proc | int, control: str, port: int | Path | None = None, log_level: int = 2
) -> Edge:
    """`bin/edge` on `port` (a free one by default, or a Unix socket) in front of `upstream` (a web
    process, or a port); ready once it says so (a stream held by its handler, its control socket
    answering) and a request through it reaches the web process."""
    uds = port if isinstance(port, Path) else None
    port = None if uds is not None else port or free_port()
    client_side = f"unix:{uds}" if uds is not None else f"127.0.0.1:{port}"
    upstream_port = upstream if isinstance(upstream, int) else upstream.port
    args = [str(ROOT / "bin" / "edge"), "--port", client_side, "--control", control.removeprefix("ipc://")]
    args += ["--upstream", f"127.0.0.1:{upstream_port}", "--log-level", str(log_level)]
    # The test's interpreter (the project's); the same environment as the web processes', so the
    # same signing key.
    proc = procs.start("edge", args, subprocess_env(PYTHON=sys.executable), port=port, uds=uds)
    wait_log_line(proc, "Pushpin ready", timeout=30)
    if not isinstance(upstream, int):
        wait_http_ok(proc, "/healthz/", timeout=30)
    proc.companions = wait_until(lambda: len(found := descendants(proc.pid)) >= 5 and found, 10, "Pushpin's parts")
    return Edge(proc=proc, control=control, url=client_side if uds is not None else proc.url)


# --- what an attacker has -----------------------------------------------------------------------


class _Recorder(http.server.BaseHTTPRequestHandler):
    """An origin that answers 200 and keeps the headers of what it was sent."""

    seen: list[dict[str, str]]

    def do_GET(self) -> None:
        self.seen.append(dict(self.headers.items()))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def real_grip_sig(procs: Procs) -> str:
    """A Grip-Sig a real bin/edge attached to a request (signed with the key the web processes
    check): what anyone who sees one request between Pushpin and the origin could replay for an hour."""
    seen: list[dict[str, str]] = []
    handler = type("Recorder", (_Recorder,), {"seen": seen})
    origin = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=origin.serve_forever, daemon=True).start()
    try:
        edge = start_edge(procs, upstream=int(origin.server_address[1]), control=control_socket())
        try:
            with urllib.request.urlopen(f"{edge.url}/anything/", timeout=15) as answer:
                answer.read()
            sig = wait_until(lambda: next((h["Grip-Sig"] for h in seen if "Grip-Sig" in h), None), 10, "a Grip-Sig")
            return str(sig)
        finally:
            edge.stop()
    finally:
        origin.shutdown()
        origin.server_close()


def listening_tcp_ports(pids: list[int]) -> set[int]:
    """The TCP ports any of `pids` listens on (from /proc: their sockets' inodes, in LISTEN)."""
    inodes: set[str] = set()
    for pid in pids:
        fds = Path(f"/proc/{pid}/fd")
        for fd in fds.iterdir() if fds.exists() else []:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rpartition(":")[2], 16))
    return ports


FORGER = r"""
import json, socket, sys
path, ports, item = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
found = {"uid": __import__("os").getuid()}
try:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
    found["control socket"] = "connected"
except OSError as exc:
    found["control socket"] = type(exc).__name__
for port in ports:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            body = json.dumps({"items": [json.loads(item)]}).encode()
            sock.sendall(b"POST /publish/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            found[str(port)] = sock.recv(64).decode(errors="replace").split("\r\n")[0]
    except OSError as exc:
        found[str(port)] = type(exc).__name__
print(json.dumps(found))
"""


def forge_as_nobody(control: str, ports: list[int], item: dict[str, Any]) -> dict[str, str]:
    """A process of another local user (nobody) trying to publish `item`: through the control
    socket, and as a POST /publish/ to each of `ports`. What each attempt got."""
    found = python_as("nobody", FORGER, control.removeprefix("ipc://"), json.dumps(ports), json.dumps(item))
    return dict(json.loads(found))


def stall_body(address: tuple[str, int], path: str, *, timeout: float = 30) -> Trickled:
    """A client that declares a body, sends ten bytes of it and never the rest, until the server
    closes the connection."""
    with socket.create_connection(address, timeout=timeout) as sock:
        started = time.monotonic()
        head = f"POST {path} HTTP/1.1\r\nHost: {address[0]}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        sock.sendall(head.encode("latin-1") + b'{"stalled"')
        received = b""
        while time.monotonic() - started < timeout:
            try:
                more = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                more = b""
            if not more:
                return Trickled(time.monotonic() - started, 0, received)
            received += more
    raise TimeoutError(f"the server kept a stalled body open for {timeout}s")


# --- a tap on the control socket ----------------------------------------------------------------


class PublishTap:
    """A ZRPC proxy in front of Pushpin's control socket (the web processes publish through it)
    that loses the publish of a chosen event (the request is answered as Pushpin would, the item
    never reaches it), or refuses the next publishes outright (as Pushpin would when it cannot)."""

    def __init__(self, control: str) -> None:
        self.control = control
        self.url = control_socket()
        self.dropped: list[int] = []
        self.dropped_at = 0.0  # time.time() of the last loss
        # Publishes seen, recovers seen, publishes refused, refusals still to make.
        self.publishes = self.recovers = self.refused = self._refuse = 0
        self._drop: set[str] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def drop(self, seq: int) -> None:
        """Lose the publish of the event `seq` (of any run: the item that carries it, with the
        events published with it), the next time it comes by."""
        with self._lock:
            self._drop.add(str(seq))

    def refuse_next(self, n: int) -> None:
        with self._lock:
            self._refuse = n

    def start(self) -> "PublishTap":
        self._context = zmq.Context()
        self._front = self._context.socket(zmq.ROUTER)
        self._front.bind(self.url)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)
        self._context.destroy(linger=0)

    def _serve(self) -> None:
        back: zmq.Socket[bytes] | None = None
        while not self._stopping.is_set():
            if not self._front.poll(100):
                continue
            peer, _, message = self._front.recv_multipart()
            request, _ = parse_tnetstring(message)
            answer: bytes | None = None
            if request["method"] == b"publish":
                answer = self._publish(request)
                if answer is None:
                    message = tnetstring(request)
            elif request["method"] == b"recover":
                with self._lock:
                    self.recovers += 1
            if answer is None:
                if back is None:
                    back = self._context.socket(zmq.DEALER)
                    back.connect(self.control)
                back.send_multipart([b"", message])
                if back.poll(10_000):
                    answer = back.recv_multipart()[-1]
                else:
                    back.close(linger=0)
                    back = None
                    continue  # no answer: the publisher times out, as with Pushpin
            self._front.send_multipart([peer, b"", answer])

    def _publish(self, request: dict[str, Any]) -> bytes | None:
        """What to answer a publish here (refused, or every item lost); None: pass it on, with
        what is left of it in `request`."""
        with self._lock:
            if self._refuse > 0:
                self._refuse -= 1
                self.refused += 1
                return tnetstring({"id": request["id"], "success": False, "condition": "unavailable"})
            self.publishes += 1
            kept = []
            for item in request["args"]["items"]:
                # A close's id is its run's last seq and `-end` (grip.close_item): it carries no event.
                ending = item.get("id", b"").endswith(b"-end")
                first, last = int(item.get("prev-id", b"-1")) + 1, -1 if ending else int(item.get("id", b"-1"))
                carried = {str(seq) for seq in range(first, last + 1)}
                if carried & self._drop:
                    self.dropped += [int(seq) for seq in carried & self._drop]
                    self._drop -= carried
                    self.dropped_at = time.time()
                else:
                    kept.append(item)
        if not kept:
            return tnetstring({"id": request["id"], "success": True, "value": {}})
        request["args"]["items"] = kept
        return None


def stack(procs: Procs, *, worker: bool = True, control: str = "", log_level: int = 2, **env: str) -> tuple[Proc, Edge]:
    """A web process behind bin/edge, leading the publishing, and a worker unless told not to
    (tests that claim runs themselves)."""
    control = control or control_socket()
    web = procs.uvicorn(env=edge_env(control, **env))
    wait_leading(web)
    edge = start_edge(procs, upstream=web, control=control, log_level=log_level)
    if worker:
        procs.worker("edge-worker", concurrency=4)
    return web, edge


@contextmanager
def tapped_stack(procs: Procs, log_level: int = 2, **env: str) -> Iterator[tuple[PublishTap, Proc, Edge]]:
    """`stack` without its worker, the publishes going to Pushpin through a tap that can lose or
    refuse them."""
    control = control_socket()
    tap = PublishTap(control).start()
    try:
        yield (
            tap,
            *stack(procs, worker=False, control=control, log_level=log_level, **env, RUNLEDGER_GRIP_URL=tap.url),
        )
    finally:
        tap.stop()


def session_headers(user: User) -> dict[str, str]:
    """What a browser's EventSource sends: the session cookie, no token."""
    browser = Client()
    browser.force_login(user)
    return {"Cookie": f"sessionid={browser.cookies['sessionid'].value}"}


async def watch_all(
    base_url: str, path: str, headers: list[dict[str, str]], *, until: Callable[[list[list[Event]]], bool] | None = None
) -> tuple[list[list[Event]], list[asyncio.Task[list[Event]]]]:
    """Open one stream per headers through `base_url` and wait until each follows the run: the
    events each has received so far (lists that keep filling) and the tasks that end with them."""
    got: list[list[Event]] = [[] for _ in headers]
    connected = [asyncio.Event() for _ in headers]
    tasks = [
        asyncio.create_task(watch(base_url, path, h, connected=c, got=g, timeout=90))
        for h, c, g in zip(headers, connected, got, strict=True)
    ]
    await asyncio.wait_for(asyncio.gather(*(c.wait() for c in connected)), 30)
    return got, tasks


async def until_each_has(got: list[list[Event]], n: int, timeout: float = 30) -> None:
    """Until each watcher of `watch_all` has `n` events, within `timeout` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while min(len(g) for g in got) < n:
        assert asyncio.get_running_loop().time() < deadline, [len(g) for g in got]
        await asyncio.sleep(0.02)  # polling the watchers' progress; the deadline above bounds it


async def watch_meanwhile(
    edge: Edge, run: Run, headers: list[dict[str, str]], meanwhile: Callable[[], object]
) -> list[list[Event]]:
    """Watchers of `run` through the edge; once each has 10 events, `meanwhile` (in a thread);
    then every stream to its end."""
    got, tasks = await watch_all(edge.url, stream_path(run), headers)
    await until_each_has(got, 10)
    await asyncio.to_thread(meanwhile)
    return list(await asyncio.wait_for(asyncio.gather(*tasks), 60))


@dataclass
class Revoked:
    got: list[list[Event]]  # each watcher's events
    ended: list[float]  # seconds from the revocation's start to each revoked watcher's stream's end
    bystanders_watch: bool  # whether every watcher the revocation spares still follows the run


async def watch_revoked(
    edge: Edge, run: Run, headers: list[dict[str, str]], revoke: Callable[[], object], *, bystanders: int = 0
) -> Revoked:
    """Watchers of `run` through the edge, one per `headers`; once each has 5 events, `revoke` (in a
    thread); then how long each stream but the last `bystanders` takes to end, each within 20 s."""
    got, tasks = await watch_all(edge.url, stream_path(run), headers)
    await until_each_has(got, 5)
    revoked, spared = tasks[: len(tasks) - bystanders], tasks[len(tasks) - bystanders :]
    start = time.monotonic()
    await asyncio.to_thread(in_thread(revoke))
    ended: list[float] = []
    for task in revoked:
        await asyncio.wait_for(task, 20)
        ended.append(time.monotonic() - start)
    watching = not any(task.done() for task in spared)
    for task in spared:
        task.cancel()
    return Revoked(got, ended, watching)


def _logged_at(edge: Edge, *texts: str) -> list[float]:
    """When (time.time(), to the millisecond) Pushpin logged each line holding every one of `texts`."""
    return [
        datetime.strptime(line[7:30], "%Y-%m-%d %H:%M:%S.%f").timestamp()
        for line in edge.log().splitlines()
        if all(text in line for text in texts)
    ]


def link_requests(edge: Edge, run: Run) -> list[float]:
    """When (time.time()) Pushpin asked for the run's events itself, by its log (each stream's
    fetch logged as its answer came)."""
    return _logged_at(edge, f"[handler] GET {edge.url}/api/runs/{run.pk}/stream/link/ ")


def first_fetches_done(edge: Edge, run: Run, streams: int) -> bool:
    """Whether each of the run's `streams` has fetched its link since the timer Pushpin starts at
    its channel's first subscription (1 s, `SUBSCRIBED_DELAY` in its handlerengine.cpp), and no
    fetch of it is under way. A fetch asked for while another waits or is under way is made after
    it, so each stream then starts one after the timer (zurl logs the start, the handler the end).
    The timer starts just before the subscribe is logged: 2 ms early counts."""
    subscribed = _logged_at(edge, "] subscribe ", f" channel={grip.channel(str(run.pk))}")
    started = _logged_at(edge, "[zurl] IN id=", f"/api/runs/{run.pk}/stream/link/")
    return (
        bool(subscribed)
        and sum(at >= subscribed[0] + 0.998 for at in started) >= streams
        and len(link_requests(edge, run)) == len(started)
    )


def publishes(edge: Edge, run: Run) -> int:
    """How many items Pushpin took on the run's channel, by its log."""
    return edge.log().count(f"publish channel={grip.channel(str(run.pk))} ")


def published(edge: Edge, run: Run, seq: int) -> bool:
    """Whether Pushpin took the item that ends with the run's event `seq`, by its debug log (log_level=3)."""
    channel, item_id = f'"channel": "{grip.channel(str(run.pk))}"', f'"id": "{seq}"'
    return any(channel in line and item_id in line for line in edge.log().splitlines() if "IN command: publish" in line)


def signed(key: str, **claims: Any) -> str:
    """A Grip-Sig as Pushpin makes it, with `claims` changed."""
    body = {"iss": "pushpin", "exp": int(time.time()) + 3600, **claims}
    return jwt.encode(body, key, algorithm="HS256")


def watched_to_the_end(
    procs: Procs, edge: Edge, run: Run, headers: list[dict[str, str]], *, once_connected: Callable[[], object]
) -> Run:
    """Watchers of the queued `run` through the edge; once all are connected, `once_connected`,
    then a worker takes the run: each watcher gets its exact log. The run, completed."""

    async def scenario() -> list[list[Event]]:
        _, tasks = await watch_all(edge.url, stream_path(run), headers)
        await asyncio.to_thread(once_connected)
        assert all(not task.done() for task in tasks)
        # Only now does a worker take the run.
        await asyncio.to_thread(procs.worker, "edge-worker")
        return list(await asyncio.wait_for(asyncio.gather(*tasks), 60))

    got = asyncio.run(scenario())
    completed = wait_status(run, "completed")
    for events in got:
        assert_exact_log(events, completed)
    return completed


def complete(run: Run) -> None:
    """End the run as its worker would."""
    services.run_complete(run_id=run.pk, generation=fresh(run).generation, output="done")


def end_the_publishers_connection() -> None:
    """What a network cut or a restarted database does to the leading publisher's connection."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE %s",
            ["runledger-edge:%"],
        )
        assert cursor.fetchall(), "no publisher connected"


def direct_connect(web: Proc, run: Run, sig: str, headers: dict[str, str]) -> Stream:
    """A connect straight to the web process with Pushpin's signature: what Pushpin passes on, so
    the hold instructions (the link included) are in the answer's headers."""
    return request_once(web.url, stream_path(run), {"Grip-Sig": sig, **headers})


def fetch_link(
    web: Proc, path: str, *, sig: str | None, last_id: int | None, token: str | None
) -> tuple[Stream, list[int]]:
    """A GET of a link as Pushpin makes it (its signature and a Grip-Last for each channel of the
    hold, nothing else): the answer, and the seqs of the events in its body."""
    run_id = path.split("/")[3]
    headers = {"Grip-Sig": sig} if sig is not None else {}
    lasts = [f"{grip.channel(run_id)}; last-id={last_id}"] if last_id is not None else []
    lasts += [f"{grip.LINK_CHANNEL}; last-id={token}"] if token is not None else []
    if lasts:
        headers["Grip-Last"] = ", ".join(lasts)

    async def go() -> tuple[Stream, list[int]]:
        answer = await Stream(web.url, path, headers).open()
        try:
            body = await answer.read_all() if answer.status == 200 else answer.body
            return answer, [event.seq for event in answer.parser.feed(body)]
        finally:
            answer.close()

    return asyncio.run(go())


def link_of(answer: Stream) -> tuple[str, str]:
    """The path of a hold's link (`Grip-Link: </…/stream/link/>; rel=next; …`), and its token (the
    previous id of the link's channel: `Grip-Channel: run-…; prev-id=2, runledger-link; prev-id=T`)."""
    path = answer.headers["grip-link"].partition(">")[0].removeprefix("<")
    return path, answer.headers["grip-channel"].rpartition("prev-id=")[2]


def append_and_complete(run: Run) -> None:
    """What a worker would write next: one delta, then the run's end."""
    fresh_run = fresh(run)
    services.run_events_append(
        run_id=run.pk, generation=fresh_run.generation, events=[(EventType.OUTPUT_DELTA, {"text": "real"})]
    )
    services.run_complete(run_id=run.pk, generation=fresh_run.generation, output="real")


async def until_seq(stream: Stream, seq: int) -> Any:
    """The stream's events up to the one of `seq`."""
    async for event in stream.events():
        yield event
        if event.seq >= seq:
            return


def settings_of(**env: str) -> subprocess.CompletedProcess[str]:
    """A process that prints the signing key the settings give it with `env`."""
    code = "import django; django.setup(); from runs.conf import conf; print(conf.GRIP_KEY)"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**subprocess_env(), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
