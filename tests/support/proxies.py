"""Loopback proxies that a test can cut: `CuttableProxy` between a browser (or Pushpin) and
uvicorn (HTTP), `PartitionableProxy` between one process and PostgreSQL (TCP)."""

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class SeenRequest:
    method: str
    path: str
    headers: dict[str, str]


class CuttableProxy:
    """A loopback HTTP/1.1 proxy between a browser and uvicorn that a test can cut.

    Chromium keeps an open EventSource streaming through `context.set_offline` and route aborts,
    so a network drop has to happen on the server side. Every request passes through here on a
    fresh upstream connection (the proxy forces `Connection: close`), the proxy records each
    request head, and the test can cut every open stream and hold new stream requests down while
    other requests (the Stop button's POST, say) still pass. `drop_next_answer(path)` makes the
    ambiguous failure of a command: the request reaches the server and is answered, but the
    answer never reaches the client. `cut_streams_after(budget)` cuts every stream answer after
    `budget()` bytes of its body, anywhere in a frame (`cut_tails` keeps the last bytes each cut
    let through, to tell where it fell, and `cut_times` its time.monotonic()).
    `cut_streams_where(chooser)` cuts where a chooser made for each stream answer says, looking at
    the bytes (right after an `id:` line, say). `withhold(match)` keeps the answers to the requests `match` picks — each served by uvicorn, its
    answer read whole and not passed on — until `release(request)`: in front of a web process
    behind Pushpin, it decides when Pushpin learns of a hold or of what a link fetch found.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.requests: list[SeenRequest] = []
        self.cuts = 0
        self._streams: set[asyncio.StreamWriter] = set()
        self._hold_streams = False
        self._drop_answer_to: str | None = None
        self.dropped_answers = 0
        self._budget: Callable[[], int] | None = None
        self._chooser: Callable[[], Callable[[bytes], int | None]] | None = None
        self.cut_tails: list[bytes] = []
        self.cut_times: list[float] = []
        self._withhold: Callable[[SeenRequest], bool] | None = None
        # The requests whose answers are kept, in the order they were read, each with its release.
        self.withheld: list[SeenRequest] = []
        self._releases: dict[int, asyncio.Event] = {}
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._server: asyncio.Server | None = None

    # --- control, from the test's thread ---

    def start(self) -> "CuttableProxy":
        self._thread.start()
        assert self._ready.wait(10), "proxy did not start"
        return self

    def stop(self) -> None:
        self._call(self._shutdown)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def cut_streams(self, *, hold: bool = False) -> int:
        """Close every open stream connection; with hold, refuse new ones until `restore()`."""
        return self._call(self._cut, hold)

    def restore(self) -> None:
        self._call(self._set_hold, False)

    def drop_next_answer(self, path: str) -> None:
        """The next request to `path` is forwarded and answered; the client's connection is then
        closed without the answer."""
        self._call(setattr, self, "_drop_answer_to", path)

    def cut_streams_after(self, budget: Callable[[], int] | None) -> None:
        """From now on each stream answer passes its head and then `budget()` bytes of its body
        (as sent: HTTP chunk framing included), and its connection is then closed, server side;
        None stops cutting. `budget` runs on the proxy's thread."""
        self._call(setattr, self, "_budget", budget)

    def cut_streams_where(self, chooser: Callable[[], Callable[[bytes], int | None]] | None) -> None:
        """From now on each stream answer gets `chooser()`, a function called with each piece of
        its body as it arrives (HTTP chunk framing included): it answers None to pass the piece
        on, or an offset in it, after which the connection is closed, server side; None stops
        cutting. Both run on the proxy's thread."""
        self._call(setattr, self, "_chooser", chooser)

    def withhold(self, match: Callable[[SeenRequest], bool] | None) -> None:
        """From now on keep the answer to each request `match` picks (on the proxy's thread) until
        `release`; None picks no more."""
        self._call(setattr, self, "_withhold", match)

    def release(self, request: SeenRequest) -> None:
        """Pass on the answer kept for `request` (one of `withheld`)."""
        self._call(lambda: self._releases[id(request)].set())

    def stream_requests(self) -> list[SeenRequest]:
        return [r for r in list(self.requests) if "/stream/" in r.path]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- the proxy itself, on its own loop ---

    def _call(self, fn, *args):  # type: ignore[no-untyped-def]
        async def run():  # type: ignore[no-untyped-def]
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def serve() -> None:
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.port = self._server.sockets[0].getsockname()[1]
            self._ready.set()

        self._loop.run_until_complete(serve())
        self._loop.run_forever()
        # Connections still open at stop (a page's last fetch) end here, on the loop, before it
        # closes: left to the garbage collector they would close their sockets on a closed loop.
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.close()

    def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        self._cut(False)

    def _set_hold(self, hold: bool) -> None:
        self._hold_streams = hold

    def _cut(self, hold: bool) -> int:
        self._hold_streams = hold
        cut = 0
        for writer in list(self._streams):
            writer.transport.abort()
            cut += 1
        self._streams.clear()
        self.cuts += cut
        return cut

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            head = await client_r.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            client_w.close()
            return
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = [*lines[0].split(" "), "", "", ""][:3]
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        is_stream = "/stream/" in path
        seen = SeenRequest(method, path, headers)
        self.requests.append(seen)
        if is_stream and self._hold_streams:
            client_w.transport.abort()
            return
        # One request per connection, so every request head passes through here.
        kept = [line for line in lines[1:] if line and not line.lower().startswith(("connection:", "keep-alive:"))]
        forwarded = "\r\n".join([lines[0], *kept, "Connection: close", "", ""]).encode("latin-1")
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.transport.abort()
            return
        if is_stream:
            self._streams.add(client_w)
        up_w.write(forwarded)
        if self._drop_answer_to is not None and path == self._drop_answer_to:
            self._drop_answer_to = None
            body = asyncio.ensure_future(self._pipe(client_r, up_w))
            await up_r.read()  # the whole answer: the server closes after it (Connection: close)
            body.cancel()
            self.dropped_answers += 1
            client_w.transport.abort()
            up_w.close()
            return
        if self._withhold is not None and self._withhold(seen):
            await self._pass_on_release(seen, client_r, client_w, up_r, up_w)
            return

        if is_stream and self._chooser is not None:
            answer = self._pipe_cut_where(up_r, client_w, self._chooser())
        elif is_stream and self._budget is not None:
            answer = self._pipe_cut(up_r, client_w, self._budget())
        else:
            answer = self._pipe(up_r, client_w)
        await asyncio.gather(self._pipe(client_r, up_w), answer)
        self._streams.discard(client_w)

    async def _pass_on_release(
        self,
        seen: SeenRequest,
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
        up_r: asyncio.StreamReader,
        up_w: asyncio.StreamWriter,
    ) -> None:
        released = self._releases[id(seen)] = asyncio.Event()
        body = asyncio.ensure_future(self._pipe(client_r, up_w))
        answer = await up_r.read()  # the whole answer: the server closes after it (Connection: close)
        self.withheld.append(seen)
        await released.wait()
        body.cancel()
        up_w.close()
        client_w.write(answer)
        with contextlib.suppress(ConnectionError):
            await client_w.drain()
        client_w.close()
        self._streams.discard(client_w)

    async def _pipe_cut(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, budget: int) -> None:
        """The answer's head, then at most `budget` bytes of its body; if the body goes on, the
        connection is closed there (a FIN after those bytes: the client sees its stream end in the
        middle of whatever it was reading)."""
        try:
            writer.write(await reader.readuntil(b"\r\n\r\n"))
            tail = b""
            while budget > 0 and (data := await reader.read(min(65536, budget))):
                writer.write(data)
                budget -= len(data)
                tail = (tail + data)[-8:]
            # Not waiting for more (a live stream may be quiet): a body that ended exactly at the
            # budget but whose end has not arrived yet would count as one cut too many.
            await writer.drain()
            if budget == 0 and not reader.at_eof():
                self.cuts += 1
                self.cut_tails.append(tail)
                self.cut_times.append(time.monotonic())
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _pipe_cut_where(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, choose: Callable[[bytes], int | None]
    ) -> None:
        """The answer's head, then its body up to where `choose` says, if it says."""
        try:
            writer.write(await reader.readuntil(b"\r\n\r\n"))
            tail = b""
            while data := await reader.read(65536):
                at = choose(data)
                passed = data if at is None else data[:at]
                writer.write(passed)
                tail = (tail + passed)[-8:]
                if at is not None:
                    await writer.drain()
                    self.cuts += 1
                    self.cut_tails.append(tail)
                    self.cut_times.append(time.monotonic())
                    break
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()  # flushes what is buffered; a cut aborts instead


# The server's CommandComplete message for a COMMIT: 'C', int32 length 11, "COMMIT\0".
COMMIT_COMPLETE = b"C\x00\x00\x00\x0bCOMMIT\x00"


class PartitionableProxy:
    """A TCP proxy in front of PostgreSQL that a test can partition, for one process only.

    A worker started with its DATABASE_URL pointing here loses the database while every other
    process keeps it. While partitioned, bytes stop flowing both ways and new connections hang, as
    on a network cut without a FIN: queries block rather than fail. `heal()` closes every
    connection that lived through the partition (their peers then see errors and reconnect) and
    lets new ones through again.

    `drop_next_commit_answer()` makes the ambiguous failure: the next answer to a COMMIT is not
    passed on and its connection is closed, so the transaction committed but its client cannot know.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._partitioned = False
        self._drop_commit_answer = False
        self.dropped_commit_answers = 0
        self._stopping = False
        self._threads: list[threading.Thread] = []

    def start(self) -> "PartitionableProxy":
        self._spawn(self._accept)
        return self

    def partition(self) -> None:
        with self._lock:
            self._partitioned = True

    def drop_next_commit_answer(self) -> None:
        with self._lock:
            self._drop_commit_answer = True

    def heal(self) -> None:
        with self._lock:
            self._partitioned = False
            doomed = list(self._sockets)
            self._sockets.clear()
        for sock in doomed:
            _close(sock)

    def stop(self) -> None:
        self._stopping = True
        self.heal()
        self._listener.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._stopping:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self._sockets.add(client)
                if self._partitioned:
                    continue  # held open, silent, until heal() closes it
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            # As libpq's own sockets: each write goes at once. With Nagle's algorithm the proxy held
            # a statement's small Sync behind the write before it for a delayed ACK (~40 ms), a
            # window a production connection does not have, in which a partition left the server
            # inside a pipelined statement with its row lock and without the idle-in-transaction
            # timer, which the Sync arms.
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets.add(upstream)
            self._spawn(self._pump, client, upstream, False)
            self._spawn(self._pump, upstream, client, True)

    def _pump(self, source: socket.socket, sink: socket.socket, from_server: bool) -> None:
        try:
            while data := source.recv(65536):
                if self._partitioned:
                    continue  # lost on the wire
                if from_server and self._drop_commit_answer and COMMIT_COMPLETE in data:
                    with self._lock:
                        self._drop_commit_answer = False
                        self.dropped_commit_answers += 1
                    return  # the connection dies with the answer unsent
                sink.sendall(data)
        except OSError:
            pass
        finally:
            _close(source)
            _close(sink)


def _close(sock: socket.socket) -> None:
    # shutdown first: it wakes a thread blocked in recv on the socket, which close alone may not.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
