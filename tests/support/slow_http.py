"""A slow streaming HTTP server in a thread of the test process, standing in for a model server:
it streams a line at a time to its client until the client goes away, and records when it saw
that — what a model server sees of a run whose stream was stopped."""

import select
import socket
import threading
import time
from types import TracebackType

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"


class SlowStream:
    """`with SlowStream() as server:` serves `server.url` until the block ends (one client at a time)."""

    def __init__(self, line_interval: float = 0.05) -> None:
        self._interval = line_interval
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)  # so the serving thread notices the end of the test
        self.port: int = self._listener.getsockname()[1]
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        # time.time() when the server saw the client go (the clock `released_at` is taken on).
        self.disconnected_at: float | None = None
        self.lines_sent = 0
        # Connections served so far, and how many lines each connection accepted from now on gets
        # before its stream ends (None: it streams until the client goes).
        self.connections = 0
        self.lines_per_connection: int | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="slow-stream", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/stream"

    def __enter__(self) -> "SlowStream":
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done.set()
        self._thread.join(timeout=10)
        self._listener.close()
        assert not self._thread.is_alive(), "the slow stream server did not stop"

    def _serve(self) -> None:
        while not self._done.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            with conn:
                self._stream(conn)

    def _stream(self, conn: socket.socket) -> None:
        request = b""
        while b"\r\n\r\n" not in request:
            chunk = conn.recv(4096)
            if not chunk:
                return
            request += chunk
        conn.sendall(HEAD)
        self.connections += 1
        self.connected.set()
        limit, sent = self.lines_per_connection, 0
        while not self._done.is_set():
            if limit is not None and sent >= limit:
                conn.sendall(b"0\r\n\r\n")  # the last chunk: the stream ends
                return
            # Paced writes; a client that closes its end makes the socket readable at once (EOF).
            readable, _, _ = select.select([conn], [], [], self._interval)
            try:
                gone = bool(readable) and not conn.recv(4096)
                if not gone:
                    line = f"line {self.lines_sent}\n".encode()
                    conn.sendall(b"%x\r\n%s\r\n" % (len(line), line))
                    self.lines_sent += 1
                    sent += 1
            except OSError:  # reset or broken pipe: gone too
                gone = True
            if gone:
                self.disconnected_at = time.time()
                self.disconnected.set()
                return
