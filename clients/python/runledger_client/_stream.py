"""Streams that resume by themselves, free of I/O and shared by both clients: an incremental
`text/event-stream` decoder, and the reconnect state machine of one `stream()` call.

The server (docs/design/streaming.md#stream) sends `retry:`, then each event as `id: <seq>`, `event:
<type>`, `data: <event JSON>`, and ends the stream after the run's terminal event. The client
resumes from the last event it *dispatched* — an event is complete only at the blank line that ends
it, so a frame cut off by a dropped connection is read again, never half-used — by sending that seq
as `Last-Event-ID`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import httpx

from runledger_client._core import RUNS, Retry, jittered, past, remaining, types_param
from runledger_client.errors import APIError, TransportError, error_from
from runledger_client.models import Event


@dataclass(frozen=True, slots=True)
class Frame:
    id: str | None
    event: str
    data: str


@dataclass
class SSEDecoder:
    """The event-stream parsing of the HTML standard: LF, CRLF or CR line ends, fields gathered
    line by line, an event dispatched at the blank line that ends it; comments are skipped."""

    retry: int | None = None  # the last `retry:` (ms)
    _buffer: bytes = b""
    _after_cr: bool = False
    _id: str | None = None
    _event: str = ""
    _data: list[str] = field(default_factory=list)

    def feed(self, chunk: bytes) -> list[Frame]:
        """The frames `chunk` completes."""
        data = self._buffer + chunk
        if self._after_cr and data.startswith(b"\n"):
            data = data[1:]  # the LF of a CRLF split between two chunks
        self._after_cr = data.endswith(b"\r")
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        # Whole lines are decoded at once (a line end never splits a UTF-8 character); the rest
        # waits for the next chunk.
        complete, _, self._buffer = data.rpartition(b"\n")
        if not _:
            return []
        frames: list[Frame] = []
        for line in complete.decode().split("\n"):
            if not line:
                if self._data:
                    frames.append(Frame(self._id, self._event or "message", "\n".join(self._data)))
                self._id, self._event, self._data = None, "", []
                continue
            name, colon, value = line.partition(":")
            if not name:
                continue  # a comment (`: keep-alive`)
            if colon and value.startswith(" "):
                value = value[1:]
            if name == "data":
                self._data.append(value)
            elif name == "id":
                if "\0" not in value:
                    self._id = value
            elif name == "event":
                self._event = value
            elif name == "retry" and value.isdigit():
                self.retry = int(value)
        return frames


class StreamState:
    """One `stream()` call across all its connections.

    A client drives it: `connect_headers()` before each request, `opened(response)` with the answer
    (True: read the body and `feed()` it), `lost(error)` when a connection fails, and, while not
    `finished`, sleeps `next_delay()` before connecting again. Events come out of `feed()` in seq
    order, each once: a seq at or below the cursor is one already yielded.
    """

    # Answers that say "not now": reconnect after a wait, as after a drop.
    TRANSIENT = frozenset({429, 502, 503, 504})

    def __init__(
        self,
        run_id: object,
        after_seq: int,
        retry: Retry,
        deadline: float | None = None,
        types: str | Iterable[str] | None = None,
    ) -> None:
        self.path = RUNS.path(run_id, "stream")
        self.params = {"after_seq": str(after_seq)} | types_param(types)
        self.after_seq = after_seq
        self.cursor = after_seq  # the seq of the last event yielded
        self.retry = retry
        self.deadline = deadline
        self.retry_ms: int | None = None  # the server's `retry:`
        self.finished = False
        self.connects = 0
        self.failures = 0  # connects in a row that the server did not accept
        self._decoder = SSEDecoder()
        self._accepted = False
        self._not_before = 0.0  # a Retry-After
        self._error: Exception | None = None

    def connect_headers(self) -> dict[str, str]:
        self.connects += 1
        self._decoder = SSEDecoder(retry=self.retry_ms)
        self._accepted = False
        self._not_before = 0.0
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        if self.cursor != self.after_seq:
            # What EventSource sends on reconnect; the server prefers it to `after_seq`.
            headers["Last-Event-ID"] = str(self.cursor)
        return headers

    def read_timeout(self, default: float) -> float:
        return remaining(self.deadline, default)

    def opened(self, response: httpx.Response) -> bool:
        """True: a stream to read. False: finished (204) or to retry later. Raises the typed error
        of a refusal (401, 403, 404, 400...). A non-200 answer's body must have been read."""
        if response.status_code == 200:
            self._accepted = True
            self.failures = 0
            return True
        if response.status_code == 204:
            # A finished run read to its end: nothing more will come.
            self.finished = True
            return False
        error = error_from(response)
        if response.status_code not in self.TRANSIENT:
            raise error
        self._error = error
        self._not_before = error.retry_after or 0.0
        return False

    def feed(self, chunk: bytes) -> list[Event]:
        events: list[Event] = []
        for frame in self._decoder.feed(chunk):
            if frame.id is None or not frame.id.isdigit():
                continue  # every event of a run carries its seq; anything else is not one
            seq = int(frame.id)
            if seq <= self.cursor:
                continue  # already yielded
            event = Event.from_json(frame.data)
            events.append(event)
            self.cursor = seq
            if event.is_terminal:
                self.finished = True
                break
        self.retry_ms = self._decoder.retry
        if past(self.deadline) and not self.finished:
            raise TimeoutError(f"stream of {self.path}: the deadline passed at seq {self.cursor}")
        return events

    def lost(self, error: httpx.TransportError) -> None:
        self._error = error

    def next_delay(self) -> float:
        """The wait before the next connect: the server's `retry:` after a stream it accepted, a
        growing backoff after connects it did not; raises once there have been too many of those."""
        retry_s = self.retry.base if self.retry_ms is None else self.retry_ms / 1000
        if self._accepted:
            delay = jittered(retry_s)
        else:
            self.failures += 1
            if self.failures >= self.retry.stream_attempts:
                raise self._give_up()
            delay = max(self.retry.backoff(self.failures, floor=retry_s), self._not_before)
        if self.deadline is not None and time.monotonic() + delay >= self.deadline:
            raise TimeoutError(f"stream of {self.path}: the deadline passed at seq {self.cursor}")
        return delay

    def _give_up(self) -> Exception:
        error = self._error
        if isinstance(error, APIError):
            return error
        message = f"stream of {self.path}: {self.failures} connects failed in a row, last: {error!r}"
        failure = TransportError(message)
        failure.__cause__ = error
        return failure


class StreamTally:
    """What a stream has yielded so far, for its `text()` and `until_end()` (sync and async)."""

    def __init__(self) -> None:
        self.terminal: Event | None = None
        self._texts: list[str] = []

    def tally(self, event: Event) -> None:
        if event.type == "output.delta":
            self._texts.append(str(event.data.get("text", "")))
        if event.is_terminal:
            self.terminal = event

    def joined_text(self) -> str:
        return "".join(self._texts)
