"""A small SSE client over raw asyncio sockets, for tests and bench/ (which also parses the streams
it records itself with `SSEParser`).

It speaks just enough HTTP/1.1 (one request per connection, chunked or sized bodies) to read a
stream the way `EventSource` does: fields accumulate per line and an event is *dispatched* only at
the blank line that ends it, which is also when its `id:` becomes the last event id sent back on
reconnect. A frame cut off by a dropped connection is therefore never counted — as in a browser.
"""

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from runs.models import Run


@dataclass
class Event:
    id: str | None
    event: str
    data: str
    received_at: float = 0.0  # time.time() when its blank line arrived

    @property
    def seq(self) -> int:
        assert self.id is not None
        return int(self.id)

    def json(self) -> Any:
        return json.loads(self.data)


@dataclass
class SSEParser:
    """Incremental `text/event-stream` parser (LF line ends, which is what the server sends).

    `id_at_parse`: take an event's id as its line is parsed, before the event is dispatched, as
    `@microsoft/fetch-event-source` does (the specification sets it at dispatch, as EventSource
    does and this parser does by default)."""

    buffer: bytes = b""
    id_at_parse: bool = False
    last_event_id: str | None = None
    retry: int | None = None
    comments: list[str] = field(default_factory=list)
    _id: str | None = None
    _event: str = ""
    _data: list[str] = field(default_factory=list)

    def feed(self, chunk: bytes, at: float | None = None) -> list[Event]:
        """The events that `chunk` completes, received `at` (a time.time(); now unless given)."""
        received_at = time.time() if at is None else at
        # One split per chunk, not one per line: a replay's chunk holds thousands of lines.
        *lines, self.buffer = (self.buffer + chunk).split(b"\n")
        events: list[Event] = []
        for raw in lines:
            line = raw.decode()
            if line == "":
                if self._data or self._event or self._id is not None:
                    if self._id is not None:
                        self.last_event_id = self._id
                    events.append(Event(self._id, self._event or "message", "\n".join(self._data), received_at))
                self._id, self._event, self._data = None, "", []
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "":
                self.comments.append(value)
            elif name == "id":
                self._id = value
                if self.id_at_parse:
                    self.last_event_id = value
            elif name == "event":
                self._event = value
            elif name == "data":
                self._data.append(value)
            elif name == "retry":
                self.retry = int(value)
        return events


class Stream:
    """One GET to a stream URL. `status`/`headers` after `open()`; `body` for non-streams."""

    def __init__(self, base_url: str, path: str, headers: dict[str, str] | None = None, method: str = "GET") -> None:
        self.base = urlsplit(base_url)
        self.method = method
        self.path = path
        self.request_headers = headers or {}
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = b""
        self.parser = SSEParser()
        self.bytes_read = 0
        self.dropped = False  # True when `events(byte_budget=...)` cut the connection
        # True when the server ended the body: its last, empty chunk came, or it closed a body of no
        # stated length.
        self.finished = False
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._chunked = False
        self._remaining: int | None = None

    async def send(self, timeout: float = 20) -> "Stream":
        """Connect and send the request, nothing more: `open()` then reads the answer (or the
        client leaves before it with `abort()`)."""
        host, port = self.base.hostname or "127.0.0.1", self.base.port or 80
        self._reader, self._writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        lines = [f"{self.method} {self.path} HTTP/1.1", f"Host: {host}:{port}", "Accept: text/event-stream"]
        lines += ["Content-Length: 0"] if self.method not in ("GET", "HEAD") else []
        lines += [f"{k}: {v}" for k, v in self.request_headers.items()]
        self._writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        await self._writer.drain()
        return self

    async def open(self, timeout: float = 20) -> "Stream":
        if self._writer is None:
            await self.send(timeout)
        assert self._reader is not None
        head = await asyncio.wait_for(self._reader.readuntil(b"\r\n\r\n"), timeout)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        self.status = int(status_line.split(" ")[1])
        for line in header_lines:
            if line:
                name, _, value = line.partition(":")
                self.headers[name.strip().lower()] = value.strip()
        self._chunked = self.headers.get("transfer-encoding", "").lower() == "chunked"
        if not self._chunked:
            length = self.headers.get("content-length")
            # Neither chunked nor sized: the body ends when the server closes the connection (a
            # WSGI server's streams, runserver's). An answer that has no body says its length.
            no_body = self.status in (204, 304) or self.method == "HEAD"
            self._remaining = None if length is None and not no_body else int(length or 0)
        if self.headers.get("content-type", "").split(";")[0] != "text/event-stream":
            self.body = await asyncio.wait_for(self.read_all(), timeout)
            self.close()
        return self

    def json(self) -> Any:
        return json.loads(self.body)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive, until it ends."""
        assert self._reader is not None
        if not self._chunked:
            while self._remaining is None or self._remaining:
                data = await self._reader.read(65536 if self._remaining is None else min(self._remaining, 65536))
                if not data:
                    self.finished = self._remaining is None
                    return
                if self._remaining is not None:
                    self._remaining -= len(data)
                yield data
            return
        while True:
            size_line = await self._reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                await self._reader.readuntil(b"\r\n")
                self.finished = True
                return
            data = await self._reader.readexactly(size)
            await self._reader.readexactly(2)
            yield data

    async def read_all(self) -> bytes:
        parts = [data async for data in self.chunks()]
        return b"".join(parts)

    async def events(self, *, byte_budget: int | None = None) -> AsyncIterator[Event]:
        """Dispatched events until the stream ends, or until `byte_budget` body bytes have arrived —
        then the connection is dropped right there, possibly mid-frame (the rest is discarded)."""
        try:
            async for data in self.chunks():
                if byte_budget is not None and self.bytes_read + len(data) >= byte_budget:
                    data = data[: byte_budget - self.bytes_read]
                    self.bytes_read += len(data)
                    for event in self.parser.feed(data):
                        yield event
                    self.abort()
                    self.dropped = True
                    return
                self.bytes_read += len(data)
                for event in self.parser.feed(data):
                    yield event
        except (asyncio.IncompleteReadError, ConnectionError):
            return

    def abort(self) -> None:
        """Drop the connection at once (RST, no goodbye), as a dying network would."""
        if self._writer is not None:
            self._writer.transport.abort()
            self._writer = None

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def request_once(base_url: str, path: str, headers: dict[str, str], method: str = "GET") -> Stream:
    """One request whose answer is not a stream, or whose stream is closed at once: its status,
    headers and body. Synchronous (its own event loop), for tests and for `wait_until`."""

    async def go() -> Stream:
        stream = await Stream(base_url, path, headers, method=method).open()
        stream.close()
        return stream

    return asyncio.run(go())


def stream_path(run: "Run") -> str:
    # Like an EventSource: the URL never changes; reconnects add the Last-Event-ID header.
    return f"/api/runs/{run.pk}/stream/?after_seq=0"


def auth_headers(token: str, last_event_id: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Token {token}"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    return headers


async def watch(
    base_url: str,
    path: str,
    headers: dict[str, str],
    *,
    timeout: float = 60,
    connected: asyncio.Event | None = None,
    got: list[Event] | None = None,
) -> list[Event]:
    """Every event of one stream until it ends (the server ends it after the terminal event).
    `connected` is set once the server is following the run for this stream; `got` (returned)
    fills up as events arrive, for callers that act on progress."""
    stream = await Stream(base_url, path, headers).open()
    assert stream.status == 200, (stream.status, stream.body)
    got = [] if got is None else got

    async def read() -> None:
        async for data in stream.chunks():
            got.extend(stream.parser.feed(data))
            # `retry:` is the first thing the server sends, once it has joined the run's feed.
            if connected is not None and stream.parser.retry is not None:
                connected.set()

    try:
        await asyncio.wait_for(read(), timeout)
    finally:
        stream.close()
    return got
