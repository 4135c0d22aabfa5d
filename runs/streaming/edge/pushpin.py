"""Pushpin in the foreground, with a configuration of its own (`bin/edge`, `manage.py runedge`;
docs/design/edge.md#pushpin-config): every part of it under its runner from one private folder,
its HTTP control port off, its key `RUNLEDGER_GRIP_KEY`.
"""

import contextlib
import ctypes
import http.server
import os
import resource
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import Any

from runs.streaming.edge.control import call, private_folder

# The path of the readiness probe, routed to this process rather than to the web processes.
PROBE_PATH = "/.runledger-edge-probe/"
# Streams one Pushpin holds at most (its default).
MAX_CONNECTIONS = 50_000
# Connections from Pushpin's proxy to its zurl (see zurl_out_specs below).
ZURL_PIPES = 8
ZURL_OUT_SPECS = ",".join(["ipc://{rundir}/{ipc_prefix}zurl-in"] * ZURL_PIPES)
# The prefix of a client side that is a Unix socket.
UNIX = "unix:"


def client_lines(port: str) -> tuple[str, str]:
    """The [runner] line of the client side, `port` as [address:]port or unix:PATH, and what Pushpin
    does with X-Forwarded-For. Behind the socket, only nginx reaches Pushpin: the address nginx
    put there ($remote_addr) passes on unchanged. Any local user reaches a TCP port, loopback too:
    the header is replaced with the address of the peer, so nothing a client says passes on."""
    if port.startswith(UNIX):
        return f"local_ports={port.removeprefix(UNIX)}", ""
    return f"http_port={port}", "truncate:0,append"


def config_text(*, port: str, control: Path, run_dir: Path, key: str, log_level: int) -> str:
    """pushpin.conf: everything under `run_dir` but the command socket, `control`, and the client
    side, `port` ([address:]port or unix:PATH)."""
    listen, forwarded_for = client_lines(port)
    return f"""\
[global]
include={{libdir}}/internal.conf
rundir={run_dir}
ipc_prefix=edge-

[runner]
# zurl too: Debian's Pushpin expects a system one, which an unprivileged run does not have.
services=condure,zurl,pushpin-proxy,pushpin-handler
{listen}
logdir={run_dir}/log
log_level={log_level}
client_buffer_size=8192
client_maxconn={MAX_CONNECTIONS}

[proxy]
routesfile=routes
sig_iss=pushpin
sig_key={key}
# The client's address for the web processes, which take it from a request Pushpin signed
# (client_lines), and the scheme a TLS proxy in front of this one saw.
x_forwarded_for={forwarded_for}
accept_x_forwarded_protocol=true
set_x_forwarded_protocol=proto-only
updates_check=off
# The same zurl socket, connected ZURL_PIPES times: the proxy hands each new request to zurl through
# a ZeroMQ pipe that holds 100 (Pushpin's OUT_HWM, fixed), and answers a request it cannot hand
# over at once 502 Bad Gateway, which an EventSource never retries. A herd of connects (200 in a
# few milliseconds) overflowed one pipe; each connection adds a pipe.
zurl_out_specs={ZURL_OUT_SPECS}
zurl_out_stream_specs=ipc://{{rundir}}/{{ipc_prefix}}zurl-in-stream
zurl_in_specs=ipc://{{rundir}}/{{ipc_prefix}}zurl-out

[handler]
push_in_spec=ipc://{{rundir}}/{{ipc_prefix}}push-in
push_in_sub_specs=ipc://{{rundir}}/{{ipc_prefix}}push-in-sub
# Publish and recover: the only way in, a socket file in a folder only this user may enter. No
# push_in_http_port: without it Pushpin opens no HTTP control port (anyone reaching one could
# publish), and push_in_spec/push_in_sub_specs (unacknowledged) stay in the private run folder.
command_spec=ipc://{control}
ipc_file_mode=600
stats_spec=ipc://{{rundir}}/{{ipc_prefix}}stats
# One event reaches ten thousand watchers at once: no rate limit on sending to subscribers.
message_rate=-1
message_hwm=1000000
# Runledger publishes each run's events in order from one publisher, so an event out of order
# means one was lost: wait a second for it, not five, before the streams fetch it themselves.
message_wait=1000
# A publish repeated within this many seconds (a new leader's first) is dropped.
id_cache_ttl=60
connection_subscription_max=20
subscription_linger=60
"""


def prepare(port: str, control: Path, upstream: str, *, key: str, log_level: int, probe_port: int) -> Path:
    """A new private folder holding pushpin.conf and routes (its sockets come later); the caller
    removes it. Only its user's: the configuration holds the signing key."""
    run_dir = Path(tempfile.mkdtemp(prefix="runledger-edge-"))
    (run_dir / "log").mkdir()
    (run_dir / "pushpin.conf").write_text(
        config_text(port=port, control=control, run_dir=run_dir, key=key, log_level=log_level)
    )
    # Every path to the web processes (one target: several would be failover, not balancing),
    # but the readiness probe's, which goes to this process (the longer path_beg wins).
    (run_dir / "routes").write_text(f"*,path_beg={PROBE_PATH} 127.0.0.1:{probe_port}\n* {upstream}\n")
    return run_dir


def _enough_files() -> None:
    """As many open files as the holder of tens of thousands of sockets needs; Pushpin's parts
    inherit it. Only root may raise the hard limit; anyone else goes as far as it allows."""
    want = 2 * MAX_CONNECTIONS + 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
            return
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


class _ProbeAnswer(http.server.BaseHTTPRequestHandler):
    """The origin of the readiness probe: a stream hold, which Pushpin's proxy must hand to its
    handler — the one path that is not ready as soon as the client port is."""

    def do_GET(self) -> None:
        self.send_response(200)
        for name, value in PROBE_ANSWER_HEADERS:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(b"ready\n")

    def log_message(self, format: str, *args: Any) -> None:
        pass


PROBE_ANSWER_HEADERS = (
    ("Content-Type", "text/plain"),
    ("Grip-Hold", "stream"),
    ("Grip-Channel", "runledger-edge-probe"),
    ("Content-Length", "6"),
)


def _connect(port: str) -> socket.socket:
    """A connection to the client side `port`, as a client would make it."""
    if port.startswith(UNIX):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(2)
        try:
            sock.connect(port.removeprefix(UNIX))
        except OSError:
            sock.close()
            raise
        return sock
    address, _, number = port.rpartition(":")
    host = address if address not in ("", "0.0.0.0", "*") else "127.0.0.1"
    return socket.create_connection((host.strip("[]"), int(number)), timeout=2)


def _probe_once(port: str) -> bool:
    try:
        with _connect(port) as sock:
            sock.sendall(f"GET {PROBE_PATH} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
            head = sock.recv(4096)
        return head.startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def front_folder_problem(folder: Path) -> str | None:
    """Why `folder` cannot hold the client socket, which is open to all (as uvicorn's is): the
    folder decides who reaches it, so it must be a real folder that others may not enter and its
    group (nginx's) may not change. None when it can."""
    try:
        found = folder.lstat()
    except FileNotFoundError:
        return f"{folder} does not exist"
    if not stat.S_ISDIR(found.st_mode):
        return f"{folder} is not a folder"
    if found.st_mode & 0o027:
        return f"{folder}: its mode is {stat.S_IMODE(found.st_mode):04o}: anyone may reach the socket (chmod 750 it)"
    return None


def _die_with_parent() -> None:
    # In the child, before exec: should this process be killed outright, Pushpin gets SIGTERM
    # instead of living on without it (Linux's PR_SET_PDEATHSIG).
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def run(*, port: str, control: Path, upstream: str, key: str, log_level: int = 2) -> int:
    """Pushpin in the foreground until it exits, or until this process gets SIGTERM or SIGINT,
    which it passes on once (the runner then stops every part of it and exits 0); its exit status.

    Pushpin listens for clients before its proxy can hand a stream to its handler: a stream
    arriving in that first fraction of a second is answered 500 "Accept service unavailable"
    (which an EventSource does not retry). So "ready" is printed only once a probe through the
    client port has been held by the handler, and its command socket answers: put the edge in
    front of clients after that line.

    `control` is the command socket's path; its folder is made (mode 700) if missing, and refused
    (PermissionError) unless it is this user's alone. A client socket (`port` unix:PATH) is open to
    all once ready, and refused (PermissionError) in a folder others may reach.
    """
    binary = shutil.which("pushpin")
    if binary is None:
        raise FileNotFoundError("pushpin is not installed (Debian: apt-get install pushpin; bin/edge does it)")
    private_folder(control.parent)
    if port.startswith(UNIX) and (problem := front_folder_problem(Path(port.removeprefix(UNIX)).parent)):
        raise PermissionError(f"the edge's client socket would be open to others: {problem}")
    probe = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ProbeAnswer)
    threading.Thread(target=probe.serve_forever, daemon=True).start()
    probe_port = int(probe.server_address[1])
    run_dir = prepare(port, control, upstream, key=key, log_level=log_level, probe_port=probe_port)
    _enough_files()
    try:
        # Its own process group, so a signal to this one's group reaches the runner once, from
        # here: a second SIGTERM makes it kill its parts instead of stopping them. -m: the logs of
        # every part on this process's output.
        child = subprocess.Popen(
            [binary, f"--config={run_dir / 'pushpin.conf'}", "-m"], start_new_session=True, preexec_fn=_die_with_parent
        )

        def pass_on(signum: int, frame: types.FrameType | None) -> None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM)

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, pass_on)
        while child.poll() is None and not _probe_once(port):
            time.sleep(0.05)  # polling for readiness; ends when the probe passes or Pushpin exits
        while child.poll() is None and call(f"ipc://{control}", "get-zmq-uris", timeout=1) is not None:
            time.sleep(0.05)  # the same, for the command socket
        # The probe's origin is done: nothing but Pushpin's client side stays open.
        probe.shutdown()
        probe.server_close()
        if port.startswith(UNIX) and child.poll() is None:
            # condure made it with this process's umask: nginx's group may connect once it may write.
            os.chmod(port.removeprefix(UNIX), 0o666)
        if child.poll() is None:
            print(f"Pushpin ready on {port}, control socket {control}, in front of {upstream}", flush=True)
        status = child.wait()
        return status if status >= 0 else 128 - status
    finally:
        probe.shutdown()
        probe.server_close()
        shutil.rmtree(run_dir, ignore_errors=True)
