"""A TCP proxy in front of PostgreSQL that a test can partition, for one process only.

A worker started with its DATABASE_URL pointing here loses the database while every other
process keeps it. While partitioned, bytes stop flowing both ways and new connections hang, as
on a network cut without a FIN: queries block rather than fail. `heal()` closes every connection
that lived through the partition (their peers then see errors and reconnect) and lets new ones
through again.

`drop_next_commit_answer()` makes the ambiguous failure: the next answer to a COMMIT is not
passed on and its connection is closed, so the transaction committed but its client cannot know.
"""

import contextlib
import socket
import threading

# The server's CommandComplete message for a COMMIT: 'C', int32 length 11, "COMMIT\0".
COMMIT_COMPLETE = b"C\x00\x00\x00\x0bCOMMIT\x00"


class PartitionableProxy:
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
