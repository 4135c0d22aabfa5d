"""Real processes for tests: uvicorn web processes and workers, each stopped by its PID.

Tests that start processes use the `procs` fixture, which stops whatever they started, whatever
happens. Subprocesses reach the test database through `subprocess_env()`. bench/ starts its
processes with `Procs` too, with an environment of its own (production intervals).
"""

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from django.db import connection

from tests.support import sse_writer
from tests.support.ports import free_port

if TYPE_CHECKING:
    from runs.models import Run

ROOT = Path(__file__).resolve().parents[2]


def database_url() -> str:
    """The URL of the database the tests are using (pytest-django's test database)."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


# Short intervals so tests that wait on them finish fast.
FAST_INTERVALS = {
    "RUNLEDGER_LEASE_SECONDS": "2",
    "RUNLEDGER_HEARTBEAT_SECONDS": "0.4",
    "RUNLEDGER_POLL_SECONDS": "0.5",
    "RUNLEDGER_SQLITE_POLL_SECONDS": "0.1",
    "RUNLEDGER_SWEEP_SECONDS": "0.5",
    "RUNLEDGER_SHUTDOWN_GRACE_SECONDS": "3",
    # Short, so that an attempt's self-fencing (lease, less unwinding time) leaves room for
    # several renewals within the short lease.
    "RUNLEDGER_CANCEL_GRACE_SECONDS": "0.2",
    "RUNLEDGER_SSE_KEEPALIVE_SECONDS": "1",
    "RUNLEDGER_LISTEN_RECONNECT_SECONDS": "0.2",
}


# For tests that hold more streams of one user on one web process than the default cap (20) to
# prove something else (many watchers, aborted streams): the cap's own tests are
# tests/streaming/test_stream_limits.py.
UNCAPPED = {"RUNLEDGER_MAX_STREAMS_PER_USER": "0"}


def subprocess_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(FAST_INTERVALS)
    env["DATABASE_URL"] = database_url()
    env["DJANGO_SETTINGS_MODULE"] = "config.settings"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def web_env(application_name: str, **extra: str) -> dict[str, str]:
    """A web process whose Django connections carry `application_name`, so tests can count them."""
    env = subprocess_env(**extra)
    if connection.vendor == "postgresql":
        env["DATABASE_URL"] = f"{database_url()}?application_name={application_name}"
    return env


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    port: int | None = None
    uds: Path | None = None  # a Unix socket it listens on, instead of `port`
    stopped: bool = field(default=False)
    # Processes it started in process groups of their own (Pushpin's runner puts each of its parts
    # in one), which a signal to its group does not reach: `stop` makes sure they are gone too.
    companions: list[int] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def url(self) -> str:
        assert self.port is not None
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL the whole process group: no cleanup runs, as when a machine dies."""
        if self.popen.poll() is None:
            os.killpg(self.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)
        self._kill_companions()
        self.stopped = True

    def stop(self, timeout: float = 10) -> int | None:
        """SIGTERM, then SIGKILL if it has not exited within `timeout` seconds; and SIGKILL for
        whatever of its process group outlived it (children that a supervisor left behind)."""
        if self.popen.poll() is None:
            os.killpg(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)
        if group_members(self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
        self._kill_companions()
        self.stopped = True
        return self.popen.returncode

    def _kill_companions(self) -> None:
        for pid in self.companions:
            if not process_gone(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def wait_exit(self, timeout: float = 60) -> None:
        """Wait for the process to exit by itself, successfully."""
        assert self.popen.wait(timeout=timeout) == 0, self.log()
        self.stopped = True


class Procs:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[Proc] = []

    def start(
        self,
        name: str,
        args: list[str],
        env: dict[str, str],
        port: int | None = None,
        cwd: Path = ROOT,
        uds: Path | None = None,
    ) -> Proc:
        log_path = self.log_dir / f"{name}-{len(self.started)}.log"
        with log_path.open("wb") as log_file:
            popen = subprocess.Popen(
                args, cwd=cwd, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
            )
        proc = Proc(name=name, popen=popen, log_path=log_path, port=port, uds=uds)
        self.started.append(proc)
        return proc

    def uvicorn(
        self,
        *,
        env: dict[str, str] | None = None,
        port: int | None = None,
        workers: int = 1,
        timeout: float = 30,
        access_log: bool = False,
        app: str = "config.asgi:application",
        uds: Path | None = None,
        options: list[str] | None = None,
        ready: str = "/healthz/",
    ) -> Proc:
        """Start a uvicorn web process and wait until it answers `ready` (/healthz/, where the
        standalone site mounts the app). With `workers` > 1 it
        is uvicorn's supervisor, which serves through that many child processes (in its process
        group, so `Proc.stop` signals them too). With `access_log`, its log has a line for every
        request it answered (`127.0.0.1:40000 - "GET /healthz/ HTTP/1.1" 200`). `app`: the site's
        application, or another (tests.support.stock_asgi: Django's own handler, unwrapped). With
        `uds`, it listens on that Unix socket and on no port. `options`: more of uvicorn's own."""
        args = [sys.executable, "-m", "uvicorn", app]
        if uds is None:
            port = port or free_port()
            args += ["--host", "127.0.0.1", "--port", str(port)]
        else:
            args += ["--uds", str(uds)]
        args += ["--log-level", "info"] if access_log else ["--no-access-log", "--log-level", "warning"]
        args += ["--workers", str(workers)] if workers > 1 else []
        proc = self.start("uvicorn", args + (options or []), env or subprocess_env(), port=port, uds=uds)
        wait_http_ok(proc, ready, timeout=timeout)
        return proc

    def runserver(self, *, env: dict[str, str] | None = None, timeout: float = 60) -> Proc:
        """Start Django's development server, `manage.py runserver` (a WSGI server, threaded), on a
        free port without its autoreloader, and wait until it answers /healthz/."""
        port = free_port()
        args = [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"]
        proc = self.start("runserver", args, env or subprocess_env(), port=port)
        wait_http_ok(proc, "/healthz/", timeout=timeout)
        return proc

    def worker(
        self,
        worker_id: str,
        *,
        concurrency: int = 1,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 30,
    ) -> Proc:
        """Start `manage.py runworker` and wait until it is ready (listening, on PostgreSQL).

        Without Django's system checks: they import every URL module and check every model and
        admin, 0.3 to 0.4 s of CPU at each of the suite's few hundred worker starts, and decide
        nothing a worker does. What a worker requires of its settings and agents it checks itself,
        with or without them (tests/deploy/test_settings.py); tests/deploy/ and the host's tests
        start it as operators do."""
        cmd = [sys.executable, "manage.py", "runworker", "--skip-checks", "--worker-id", worker_id]
        cmd += ["--concurrency", str(concurrency)]
        proc = self.start(f"worker-{worker_id}", cmd + (args or []), env or subprocess_env())
        wait_log_line(proc, f"runworker {worker_id} ready", timeout=timeout)
        return proc

    def stop_all(self, timeout: float = 5) -> None:
        for proc in reversed(self.started):
            if not proc.stopped:
                proc.stop(timeout=timeout)


def uvicorn_refusal(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Start a web process that must refuse to start with `env`; its exit (non-zero) and output."""
    refused = subprocess.run(
        [sys.executable, "-m", "uvicorn", "config.asgi:application", "--port", str(free_port())],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0, refused.stdout + refused.stderr
    return refused


def start_writer(
    procs: Procs,
    run: "Run",
    *,
    count: int,
    seed: int,
    pause_ms: float,
    max_batch: int = 3,
    complete: bool = True,
    mixed: bool = False,
) -> Proc:
    """The stand-in worker (tests/support/sse_writer.py): appends through the services in its own process."""
    args = [sys.executable, "-m", sse_writer.__name__, str(run.pk), str(run.generation), "--count", str(count)]
    args += ["--seed", str(seed), "--pause-ms", str(pause_ms), "--max-batch", str(max_batch)]
    args += ["--complete"] if complete else []
    args += ["--mixed"] if mixed else []
    return procs.start("sse-writer", args, subprocess_env())


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client's connection, to a server on a Unix socket."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(str(self.socket_path))


def _status_of(proc: Proc, path: str) -> int:
    if proc.uds is None:
        with urllib.request.urlopen(proc.url + path, timeout=2) as response:
            return int(response.status)
    connection = UnixHTTPConnection(proc.uds, timeout=2)
    try:
        connection.request("GET", path)
        return connection.getresponse().status
    finally:
        connection.close()


def wait_http_ok(proc: Proc, path: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log()}")
        try:
            if _status_of(proc, path) == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{proc.name} did not answer {path} within {timeout}s:\n{proc.log()}")
        time.sleep(0.05)  # polling for readiness; the deadline above bounds it


def wait_log_line(proc: Proc, text: str, timeout: float = 30) -> None:
    """Wait until `text` appears in the process's log (it must keep running meanwhile)."""
    deadline = time.monotonic() + timeout
    while text not in proc.log():
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{proc.name} did not log {text!r} within {timeout}s:\n{proc.log()}")
        time.sleep(0.05)  # polling a log file; the deadline above bounds it


def proc_status(pid: int) -> dict[str, int]:
    """RSS (kB) and thread count of a process, from /proc."""
    out = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                out["rss_kb"] = int(line.split()[1])
            elif line.startswith("Threads:"):
                out["threads"] = int(line.split()[1])
    return out


def threads_of(pid: int) -> int:
    return proc_status(pid)["threads"]


def connections_to(port: int) -> int:
    """Established TCP connections whose server end is `port` on this machine (from /proc/net):
    the client connections a web process holds open."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as rows:
            next(rows)
            for row in rows:
                local, state = row.split()[1], row.split()[3]
                count += state == "01" and int(local.rsplit(":", 1)[1], 16) == port
    return count


def process_gone(pid: int) -> bool:
    """True once `pid` has exited: no such process, or a zombie (dead, its exit status waiting for
    a parent that may never collect it — an orphan's new parent in a container often does not)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("State:"):
                    return line.split()[1] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True
    return False


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, process group) of `pid` from /proc, or None once it has exited."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name, in parentheses, may hold anything: the fields follow its last ')'.
    state, ppid, pgrp = stat.rpartition(")")[2].split()[:3]
    return state, int(ppid), int(pgrp)


def parent_of(pid: int) -> int | None:
    """The parent process id of `pid`, or None once it has exited."""
    found = _stat(pid)
    return None if found is None else found[1]


def _live(where: Callable[[int, int], bool]) -> list[int]:
    """The live processes (zombies left out) whose parent and process group `where` accepts."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            state, ppid, pgrp = stat
            if where(ppid, pgrp) and state not in ("Z", "X"):
                found.append(int(entry))
    return sorted(found)


def children_of(pid: int) -> list[int]:
    """The live child processes of `pid`."""
    return _live(lambda ppid, _pgrp: ppid == pid)


def descendants(pid: int) -> list[int]:
    """The live processes `pid` started, and theirs, and so on."""
    found = children_of(pid)
    for child in list(found):
        found += descendants(child)
    return found


def group_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid`."""
    return _live(lambda _ppid, pgrp: pgrp == pgid)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    registry = Procs(tmp_path)
    try:
        yield registry
    finally:
        registry.stop_all()


def python_as(user: str, script: str, *args: str) -> str:
    """What `script` printed, run by Debian's Python as local user `user` with that user's own groups
    (runuser: root only), in an environment of nothing but PATH; it must exit 0."""
    done = subprocess.run(
        ["/usr/sbin/runuser", "-u", user, "--", "/usr/bin/python3", "-c", script, *args],
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def require_root(why: str) -> None:
    """Fail, rather than skip, a test that must act as another user: the suite runs as root (bin/test
    installs packages, CI runs it as root), and a skipped proof is no proof."""
    if os.geteuid() != 0:
        pytest.fail(f"this test needs root, {why}; bin/test and CI run as root")
