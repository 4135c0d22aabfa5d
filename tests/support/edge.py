"""Debian's Pushpin in front of web processes, started by `bin/edge` as an operator would; a tap on
its control socket that loses or refuses a chosen publish; and what an attacker of the edge would
use: a Grip-Sig Pushpin really signed, the TCP ports its parts listen on, a process of another user.

`bin/edge` (manage.py runedge) starts Pushpin's runner in a process group of its own, and the
runner starts its parts (condure, zurl, the proxy and the handler) each in one of their own: they
are recorded as the `Proc`'s companions, so stopping it by its PID also makes sure they are gone.
"""

import atexit
import http.server
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

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
from tests.support.waiting import wait_until

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
