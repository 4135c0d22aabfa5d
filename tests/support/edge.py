"""Debian's Pushpin in front of web processes, started by `bin/edge` as an operator would, and a
tap on its control port that loses a chosen publish.

`bin/edge` (manage.py runedge) starts Pushpin's runner in a process group of its own, and the
runner starts its parts (condure, zurl, the proxy and the handler) each in one of their own: they
are recorded as the `Proc`'s companions, so stopping it by its PID also makes sure they are gone.
"""

import http.client
import http.server
import json
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

from tests.support.procs import (
    ROOT,
    Proc,
    Procs,
    descendants,
    free_port,
    process_gone,
    subprocess_env,
    wait_http_ok,
    wait_log_line,
)
from tests.support.waiting import wait_until

# Pushpin asks an idle stream's web process again this often (the safety net of a lost publish).
LINK_SECONDS = "2"


def edge_env(control_port: int, **extra: str) -> dict[str, str]:
    """A web process behind the edge whose control port is `control_port` (`extra` wins)."""
    grip = {"RUNLEDGER_GRIP_URL": f"http://127.0.0.1:{control_port}", "RUNLEDGER_GRIP_LINK_SECONDS": LINK_SECONDS}
    return subprocess_env(**{**grip, **extra})


def wait_leading(web: Proc, timeout: float = 20) -> None:
    """Until the web process's publisher leads (it logs it)."""
    wait_log_line(web, "edge publisher", timeout=timeout)
    wait_log_line(web, " leads: ", timeout=timeout)


@dataclass
class Edge:
    proc: Proc
    control_port: int
    url: str  # bin/edge's client port: where clients connect

    def log(self) -> str:
        return self.proc.log()

    def parts_alive(self) -> list[int]:
        return [pid for pid in self.proc.companions if not process_gone(pid)]

    def stop(self) -> int | None:
        """SIGTERM to bin/edge's PID (Pushpin's runner): its exit status (SIGKILL after 15 s, and
        for any part left behind)."""
        return self.proc.stop(timeout=15)


def start_edge(procs: Procs, *, upstream: Proc, control_port: int, port: int | None = None) -> Edge:
    """`bin/edge` on `port` (a free one by default) in front of `upstream`; ready once a request
    through it reaches the web process and its control port answers."""
    port = port or free_port()
    args = [str(ROOT / "bin" / "edge"), "--port", f"127.0.0.1:{port}", "--control-port", f"127.0.0.1:{control_port}"]
    args += ["--upstream", f"127.0.0.1:{upstream.port}"]
    # The test's interpreter (the project's); the same environment as the web processes', so the
    # same signing key.
    proc = procs.start("edge", args, subprocess_env(PYTHON=sys.executable), port=port)
    # Printed once a stream through it has been held by its handler (runs/edge/pushpin.py).
    wait_log_line(proc, "Pushpin ready", timeout=30)
    wait_http_ok(proc, "/healthz/", timeout=30)

    def control_answers() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{control_port}/", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    wait_until(control_answers, 15, "Pushpin's control port answering")
    proc.companions = wait_until(lambda: len(found := descendants(proc.pid)) >= 5 and found, 10, "Pushpin's parts")
    return Edge(proc=proc, control_port=control_port, url=proc.url)


class PublishTap:
    """An HTTP proxy in front of Pushpin's control port (the web processes publish through it)
    that loses the publish of a chosen event (the request is answered as Pushpin would, the item
    never reaches it), or refuses the next publishes outright (503, as a proxy would for a
    Pushpin it cannot reach)."""

    def __init__(self, control_port: int) -> None:
        self.control_port = control_port
        self.port = 0
        self.dropped: list[int] = []
        self.dropped_at = 0.0  # time.time() of the last loss
        # Publishes seen, recovers seen, publishes refused, refusals still to make.
        self.publishes = self.recovers = self.refused = self._refuse = 0
        self._drop: set[str] = set()
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def drop(self, seq: int) -> None:
        """Lose the publish of the event `seq` (of any run: the item that carries it, with the
        events published with it), the next time it comes by."""
        with self._lock:
            self._drop.add(str(seq))

    def refuse_next(self, n: int) -> None:
        with self._lock:
            self._refuse = n

    def start(self) -> "PublishTap":
        tap = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # the publisher keeps its connection

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path.startswith("/publish") and tap._refusing():
                    status, answer = 503, b"Service Unavailable\n"
                else:
                    if self.path.startswith("/publish"):
                        body = tap._filter(body)
                    elif self.path.startswith("/recover"):
                        with tap._lock:
                            tap.recovers += 1
                    status, answer = tap._forward(self.path, body)
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _refusing(self) -> bool:
        with self._lock:
            if self._refuse <= 0:
                return False
            self._refuse -= 1
            self.refused += 1
            return True

    def _filter(self, body: bytes) -> bytes | None:
        items = json.loads(body)["items"]
        with self._lock:
            self.publishes += 1
            kept = []
            for item in items:
                carried = {str(seq) for seq in range(int(item.get("prev-id", -1)) + 1, int(item.get("id", -1)) + 1)}
                if carried & self._drop:
                    self.dropped += [int(seq) for seq in carried & self._drop]
                    self._drop -= carried
                    self.dropped_at = time.time()
                else:
                    kept.append(item)
        return json.dumps({"items": kept}).encode() if kept else None

    def _forward(self, path: str, body: bytes | None) -> tuple[int, bytes]:
        if body is None:
            return 200, b"Published\n"  # what Pushpin says
        conn = http.client.HTTPConnection("127.0.0.1", self.control_port, timeout=10)
        try:
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            answer = conn.getresponse()
            return answer.status, answer.read()
        except OSError:
            return 502, b"Pushpin unreachable\n"
        finally:
            conn.close()
