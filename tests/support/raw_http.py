"""HTTP/1.1 clients over raw sockets that behave as ordinary clients cannot: one that uploads a large
body and notes how much of it was sent when the answer came, one that sends its headers a line at a
time and never finishes them (slowloris), one that connects from another loopback address or to a Unix socket."""

import contextlib
import select
import socket
import time
from dataclasses import dataclass
from pathlib import Path

CHUNK = 64 * 1024
FILLER = b"x" * CHUNK
# How long a client waits, after an answer, to see whether the server closes the connection.
CLOSE_WAIT = 5.0


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes
    sent: int  # body bytes the client had sent when the answer's first bytes arrived
    seconds: float  # from the end of the request's headers to the answer's first bytes
    closed: bool  # the server closed the connection after the answer
    reset: bool = False  # ... by a reset (it closed with bytes of the client's unread), not a FIN


def _read_answer(
    sock: socket.socket, head: bytes, deadline: float, close_wait: float
) -> tuple[int, dict[str, str], bytes, bool, bool]:
    """The answer whose first bytes are `head`: status, headers, body, whether the server then
    closed the connection within `close_wait` seconds (0: not looked at, False), and whether by a
    reset."""
    data = head
    while b"\r\n\r\n" not in data:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        more = sock.recv(65536)
        if not more:
            raise ConnectionError(f"the server closed the connection mid-answer: {data!r}")
        data += more
    raw_head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = raw_head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    chunked = headers.get("transfer-encoding", "").lower() == "chunked"
    length = int(headers.get("content-length", "0"))
    while (b"\r\n0\r\n\r\n" not in b"\r\n" + body) if chunked else len(body) < length:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        more = sock.recv(65536)
        if not more:
            break
        body += more
    if chunked:
        body = _dechunk(body)
    if not close_wait:
        return int(status_line.split(" ")[1]), headers, body, False, False
    closed = reset = False
    sock.settimeout(min(max(deadline - time.monotonic(), 0.01), close_wait))
    try:
        closed = sock.recv(1) == b""
    except ConnectionResetError:  # closed with the client's unread body still arriving: a reset
        closed = reset = True
    except TimeoutError:
        closed = False
    return int(status_line.split(" ")[1]), headers, body, closed, reset


def _dechunk(data: bytes) -> bytes:
    body = b""
    while True:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return body
        body, data = body + data[:size], data[size + 2 :]


def upload(
    address: tuple[str, int],
    path: str,
    *,
    size: int,
    body_bytes: int | None = None,
    chunked: bool = False,
    chunk_size: int = CHUNK,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
    close_wait: float = CLOSE_WAIT,
) -> Answer:
    """POST a body of `size` bytes (declared in Content-Length, or sent chunked) `chunk_size` bytes
    at a time, looking for an answer before each chunk, and stop sending as soon as one arrives.
    The look waits up to a millisecond, so the client sends at most `chunk_size` bytes a
    millisecond (64 MB/s by default, about what a fast network carries) and `Answer.sent` measures
    how soon the server answered, not how deep the loopback's socket buffers are. With
    `body_bytes`, only that much of the body is sent (0: the headers alone), and the client waits
    for the answer."""
    assert chunk_size <= CHUNK
    to_send = size if body_bytes is None else body_bytes
    lines = [f"POST {path} HTTP/1.1", f"Host: {address[0]}:{address[1]}", "Content-Type: application/json"]
    lines += ["Transfer-Encoding: chunked"] if chunked else [f"Content-Length: {size}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    deadline = time.monotonic() + timeout
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        headers_sent = time.monotonic()
        sent, first = 0, b""
        while not first:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer after {sent} body bytes in {timeout}s")
            readable, _, _ = select.select([sock], [], [], 0.001)
            if readable:
                first = sock.recv(65536)
                if not first:
                    raise ConnectionError(f"the server closed the connection without an answer after {sent} bytes")
                break
            if sent == to_send:
                continue  # all sent: wait for the answer
            part = min(chunk_size, to_send - sent)
            frame = FILLER[:part]
            if chunked:
                frame = f"{part:x}\r\n".encode() + frame + b"\r\n" + (b"0\r\n\r\n" if sent + part == size else b"")
            try:
                sock.sendall(frame)
            except (BrokenPipeError, ConnectionResetError):
                continue  # the server closed it: its answer is waiting to be read
            sent += part
        seconds = time.monotonic() - headers_sent
        status, answer_headers, body, closed, reset = _read_answer(sock, first, deadline, close_wait)
    return Answer(status, answer_headers, body, sent, seconds, closed, reset)


def request(
    address: tuple[str, int] | Path,
    path: str,
    *,
    source: str = "127.0.0.1",
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    method: str = "GET",
    chunked: bool = False,
    timeout: float = 15,
) -> Answer:
    """One request on a connection of its own, made from the loopback address `source` (any of
    127.0.0.0/8 reaches this machine), or to the Unix socket `address`; with `chunked`, its body
    goes as one chunk."""
    host = "localhost" if isinstance(address, Path) else f"{address[0]}:{address[1]}"
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: close"]
    size = len(body)
    if chunked:
        lines += ["Transfer-Encoding: chunked"]
        body = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    elif body or method not in ("GET", "HEAD"):
        lines += [f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX if isinstance(address, Path) else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        if isinstance(address, Path):
            sock.connect(str(address))
        else:
            sock.bind((source, 0))
            sock.connect(address)
        # If the server closes it before the body is all sent, what it answered is read below.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        started = time.monotonic()
        status, answer_headers, answer_body, closed, reset = _read_answer(sock, b"", deadline, CLOSE_WAIT)
    return Answer(status, answer_headers, answer_body, size, time.monotonic() - started, closed, reset)


@dataclass
class Trickled:
    seconds: float  # from the first byte sent until the server closed the connection
    lines: int  # header lines sent meanwhile
    received: bytes  # whatever the server sent before closing (nothing, or an error answer)


def trickle_headers(address: tuple[str, int], path: str, *, every: float = 1.0, timeout: float = 30) -> Trickled:
    """A slowloris client: the request line, then one more header line every `every` seconds and
    never the blank line that would end the headers, until the server closes the connection."""
    with socket.create_connection(address, timeout=timeout) as sock:
        started = time.monotonic()
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {address[0]}:{address[1]}\r\n".encode("latin-1"))
        lines, received = 2, b""
        while time.monotonic() - started < timeout:
            readable, _, _ = select.select([sock], [], [], every)
            if readable:
                try:
                    more = sock.recv(65536)
                except ConnectionResetError:
                    more = b""
                if not more:
                    return Trickled(time.monotonic() - started, lines, received)
                received += more
                continue
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # closed: the next look says so
                sock.sendall(f"X-Trickle-{lines}: still coming\r\n".encode("latin-1"))
                lines += 1
    raise TimeoutError(f"the server kept a half-sent request open for {timeout}s ({lines} header lines)")
