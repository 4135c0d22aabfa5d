"""The steps an agent takes through its context that cancelling its task cannot stop by itself
(docs/design/execution.md#step-kinds): child processes, blocking code in threads, HTTP streams,
each tracked from start to end so none outlives the attempt's release
(docs/design/execution.md#stopping-steps says how).
"""

import asyncio
import contextlib
import logging
import os
import signal
import ssl
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from contextvars import copy_context
from functools import cache
from typing import Any, ParamSpec, TypeVar

import certifi
import httpx

from runs import services
from runs.agents.base import CancellationToken, Cancelled
from runs.conf import conf
from runs.worker import orphans
from runs.worker.writer import EventWriter

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

# Arguments that would take a child out of the process group the attempt stops it by.
_GROUP_ARGUMENTS = ("start_new_session", "process_group")

# What a tool process gets of the worker's environment, when the worker has them: enough to find
# programs and run them in the right language and places — never the worker's secrets (its
# DJANGO_SECRET_KEY, the database's password in DATABASE_URL, the model's API key). More names:
# RUNLEDGER_TOOL_ENV; an agent's own `env=` adds to these and wins.
TOOL_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")


def tool_environment(given: Mapping[str, str] | None = None) -> dict[str, str]:
    """A tool process's environment: the worker's variables of those names, then `given` over them."""
    names = (*TOOL_ENV, *conf.TOOL_ENV)
    return {**{name: os.environ[name] for name in names if name in os.environ}, **(given or {})}


@cache
def _tls() -> ssl.SSLContext:
    # What httpx would build for each client (certifi's bundle), built once: loading the bundle
    # takes some 20 ms, on the loop every attempt shares.
    return ssl.create_default_context(cafile=certifi.where())


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class _ChildProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's own protocol for `create_subprocess_exec`, which also tells when the leader
    exited and was reaped: `Process.wait()` waits for its pipes to close as well, and a grandchild
    holding a pipe would keep it waiting."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop, on_exit: Callable[[int], None]) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()
        self._on_exit = on_exit

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert isinstance(transport, asyncio.SubprocessTransport)
        self._pid = transport.get_pid()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)
        self._on_exit(self._pid)


class Steps:
    """The child processes, threads and HTTP streams of one attempt."""

    def __init__(
        self,
        *,
        label: str,
        token: CancellationToken,
        grace_seconds: float,
        writer: EventWriter | None = None,
    ) -> None:
        self._label = label
        # Records each process group on the attempt (without one, nothing is recorded).
        self._writer = writer
        self._token = token
        self._grace = grace_seconds
        # Loop time by which the unwind must be done; set when it starts (`deadline`).
        self._deadline: float | None = None
        # Leaders not reaped yet, by pid (= their process group's id).
        self._processes: dict[int, _ChildProtocol] = {}
        self._terminated: set[int] = set()
        # One future per thread, resolved by the thread when it ends.
        self._threads: set[asyncio.Future[Any]] = set()
        # Open HTTP responses, and the clients the attempt made for the agent's streams.
        self._responses: set[httpx.Response] = set()
        self._clients: set[httpx.AsyncClient] = set()
        # No new step starts once this is set; `_stopped` once `close` ran.
        self._closed = self._stopped = False

    def deadline(self) -> float:
        """The one deadline of the attempt's whole unwind, taken when it starts (the token's trip,
        or the attempt's end): the agent's task, SIGTERM before SIGKILL and the threads all get
        until then. Killing, reaping and closing the agent's generator share one more grace
        (`hard`). Both fit in what `AttemptConfig.fence_after` sets aside for unwinding."""
        if self._deadline is None:
            self._deadline = asyncio.get_running_loop().time() + self._grace
        return self._deadline

    def time_left(self, *, hard: bool = False) -> float:
        left = self.deadline() + (self._grace if hard else 0.0) - asyncio.get_running_loop().time()
        return max(0.0, left)

    def _check_open(self) -> None:
        if self._closed or self._token.tripped:
            raise Cancelled(self._token.reason or "the attempt has ended")

    # --- child processes -------------------------------------------------------------------------

    async def start_process(
        self, program: str | os.PathLike[str], *args: Any, **kwargs: Any
    ) -> asyncio.subprocess.Process:
        self._check_open()
        for name in _GROUP_ARGUMENTS:
            if name in kwargs:
                raise ValueError(f"{name} is the attempt's: it stops a child process by its process group")
        loop = asyncio.get_running_loop()
        limit = kwargs.pop("limit", 2**16)
        # The kernel kills the child when the thread that forked it ends, which must not be before
        # the worker ends. `subprocess_exec` forks right here, in the thread running the worker's
        # loop, and that thread runs as long as the worker: under `runworker` the main thread, whose
        # end is the process's; where `Worker.run` is called from another thread (tests, an
        # embedding), that thread, which returns only once every attempt has stopped its groups
        # anyway. No other thread (database lanes, `to_thread`, asyncio's waitpid threads) ever
        # starts a tool, so none of them ending kills one.
        preexec_fn = orphans.dies_with(os.getpid(), then=kwargs.pop("preexec_fn", None))
        env = tool_environment(kwargs.pop("env", None))
        transport, protocol = await loop.subprocess_exec(
            lambda: _ChildProtocol(limit, loop, self._leader_exited),
            program,
            *args,
            start_new_session=True,
            preexec_fn=preexec_fn,
            env=env,
            **kwargs,
        )
        process = asyncio.subprocess.Process(transport, protocol, loop)
        if not protocol.exited.done():
            self._processes[process.pid] = protocol
        if self._closed:
            # Started while the attempt was stopping its steps: it must not outlive the attempt.
            self._stop_group(process.pid, signal.SIGKILL)
            await protocol.exited
            raise Cancelled(self._token.reason or "the attempt has ended")
        await self._record(process.pid, protocol)
        return process

    async def _record(self, pid: int, protocol: _ChildProtocol) -> None:
        """Store the new group on the attempt before the agent gets its process: if the worker dies
        without stopping it, a worker on this machine finds it there (`runs.worker.orphans`)."""
        ticks = orphans.start_ticks(pid)
        if self._writer is None or ticks is None or protocol.exited.done():
            return  # nowhere to record it; or the leader is gone already, its group with it
        lease = self._writer.lease
        try:
            # Retried while the database is unreachable and the lease holds, like the events.
            await self._writer.commit(
                services.run_attempt_group_record, run_id=lease.run_id, generation=lease.generation, group=[pid, ticks]
            )
        except Exception as exc:
            # Unrecorded, nobody could find it after a crash: it does not run.
            self._stop_group(pid, signal.SIGKILL)
            await protocol.exited
            if self._token.tripped:
                raise Cancelled(self._token.reason or "the attempt has ended") from exc
            raise

    def _leader_exited(self, pid: int) -> None:
        # The leader is reaped (perhaps before `start_process` even tracked it): its group id stays
        # ours only while some member is left, so whatever is left goes now, never later.
        self._processes.pop(pid, None)
        _signal_group(pid, signal.SIGKILL)

    def _stop_group(self, pid: int, sig: signal.Signals) -> None:
        if pid in self._processes:
            _signal_group(pid, sig)

    def interrupt(self) -> None:
        """Start the unwind: its deadline runs from now, and every running process group gets
        SIGTERM (once), so that each process has the whole grace to exit."""
        self.deadline()
        for pid in list(self._processes):
            if pid not in self._terminated:
                self._terminated.add(pid)
                self._stop_group(pid, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL every running process group at once, for a worker exiting without waiting."""
        self._closed = True
        for pid in list(self._processes):
            self._stop_group(pid, signal.SIGKILL)

    # --- threads ---------------------------------------------------------------------------------

    async def to_thread(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        self._check_open()
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()
        context = copy_context()

        def settle(result: Any, error: BaseException | None) -> None:
            if done.done():
                return
            if error is None:
                done.set_result(result)
            else:
                done.set_exception(error)

        def body() -> None:
            result: Any = None
            error: BaseException | None = None
            try:
                result = context.run(fn, *args, **kwargs)
            except BaseException as exc:  # it belongs to whoever awaits the thread, if anyone still does
                error = exc if isinstance(exc, Exception) else RuntimeError(f"the thread raised {exc!r}")
            # The loop is closed when the worker exited before this abandoned thread ended.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle, result, error)

        self._threads.add(done)
        done.add_done_callback(self._threads.discard)
        # A daemon thread of its own, not the loop's default executor: an abandoned thread there
        # would hold a pool slot for as long as it runs (enough of them starve every other
        # `to_thread`), and interpreter exit joins executor threads, so it would also hold up the
        # worker's shutdown.
        name = f"{getattr(fn, '__qualname__', 'thread')} of {self._label}"
        threading.Thread(target=body, name=name, daemon=True).start()
        # Shielded: cancelling the agent ends its await at once, but not the attempt's own
        # knowledge of when the thread really ends.
        return await asyncio.shield(done)

    def _late_thread(self, done: asyncio.Future[Any]) -> None:
        if not done.cancelled():
            done.exception()  # retrieved, so asyncio does not report it as unhandled
        log.warning("an abandoned thread of %s finished late; its result was discarded", self._label)

    # --- HTTP streams ----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def http_stream(
        self, method: str, url: httpx.URL | str, *, client: httpx.AsyncClient | None = None, **kwargs: Any
    ) -> AsyncIterator[httpx.Response]:
        self._check_open()
        own: httpx.AsyncClient | None = None
        if client is None:
            # Tracked from the start: a request still waiting for its headers holds a connection too.
            client = own = httpx.AsyncClient(verify=_tls())
            self._clients.add(own)
        try:
            async with client.stream(method, url, **kwargs) as response:
                self._responses.add(response)
                try:
                    yield response
                finally:
                    self._responses.discard(response)
        finally:
            if own is not None:
                self._clients.discard(own)
                await own.aclose()

    async def _close_http(self, closable: httpx.Response | httpx.AsyncClient) -> None:
        # A response not read to its end closes its connection, and a client its pool: either
        # way the server sees the disconnect.
        try:
            await closable.aclose()
        except Exception:
            log.debug("%s: closing an HTTP stream raised", self._label, exc_info=True)

    # --- stopping --------------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop every step still running; the attempt calls this before it records its release.

        Processes and threads get until the deadline; then the process groups left are killed
        and their leaders reaped, HTTP streams closed, within the hard deadline. A thread still
        running then is abandoned. Later calls return at once."""
        if self._stopped:
            return
        self._closed = self._stopped = True
        self.interrupt()
        # The agent's task has ended or been abandoned by now, so nobody else is reading them.
        http: list[httpx.Response | httpx.AsyncClient] = [*self._responses, *self._clients]
        self._responses.clear()
        self._clients.clear()
        if http:
            closing = [asyncio.ensure_future(self._close_http(c)) for c in http]
            await asyncio.wait(closing, timeout=self.time_left(hard=True))
        running = [p.exited for p in self._processes.values()] + list(self._threads)
        if running:
            await asyncio.wait(running, timeout=self.time_left())
        if self._processes:
            log.info(
                "%s: killing the process groups still running after the grace: %s", self._label, list(self._processes)
            )
            for pid in list(self._processes):
                self._stop_group(pid, signal.SIGKILL)
            exits = [p.exited for p in self._processes.values()]
            await asyncio.wait(exits, timeout=self.time_left(hard=True))
            for pid in self._processes:
                log.error("%s: child process %d did not die of SIGKILL in time; releasing anyway", self._label, pid)
        for done in list(self._threads):
            log.warning("%s: a thread is still running after the grace; abandoning it", self._label)
            done.add_done_callback(self._late_thread)
        self._threads.clear()
