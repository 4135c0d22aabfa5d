"""The SSE stream of a run's events (docs/design/streaming.md#stream): a plain async view, read-only.

Its checks run on the opening threads (opening.py, checks.py), then the user's cap (guard.py);
the body sends the hub's shared frames (hub.py) until the terminal event, the stream's lifetime or
the re-check's end. Behind the edge (`RUNLEDGER_GRIP_URL`) a connect Pushpin signed is answered by
edge/hold.py instead.
"""

import asyncio
import logging
import math
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from typing import TypeVar

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from runs.conf import conf
from runs.http.errors import error_response_for
from runs.http.middleware import opened as opened_in_hop
from runs.http.request_end import at_request_end
from runs.metrics import series
from runs.streaming import opening
from runs.streaming.checks import Opened, open_checks
from runs.streaming.edge import grip, hold
from runs.streaming.guard import StreamGuard, Watch, get_guard, too_many_streams
from runs.streaming.hub import Frame, Hub, Read, frames_of, get_hub, read_frames, read_frames_now
from runs.streaming.responses import WatchedResponse, served_under_wsgi

log = logging.getLogger(__name__)
T = TypeVar("T")

KEEPALIVE = b": keep-alive\n\n"
# The most one write of a stream joins (a bigger frame goes alone, as the shared bytes it is).
CHUNK_BYTES = 256_000
# Events a new stream's feed reads from the watcher's cursor rather than from the run's last event.
SHORT_BACKLOG = 100


# Read-only whatever the method, so CSRF protects nothing here; exempt, a POST gets the JSON 405
# once authenticated and shown a visible run.
@csrf_exempt
@served_under_wsgi
async def run_stream(request: HttpRequest, run_id: str) -> HttpResponseBase:
    early = opened_in_hop(request)
    if early is not None:
        # Opened in the middleware's hop (`_Opening`): a refusal, or the stream's head.
        head, found = early
        if found is None or not isinstance(head, WatchedResponse):
            return head  # a refusal, or what a middleware's process_response made of the head
    else:
        head = None
        if conf.GRIP_URL:
            edge_client(request)
        if conf.GRIP_URL and not request.GET.get("types"):
            # Behind the edge (docs/design/edge.md#grip): a request Pushpin signed is answered with
            # hold instructions instead of a stream; any other falls through to the stream below.
            # The edge sends a run's every event, so a stream of chosen types is served here.
            held = await hold.respond(request, run_id)
            if held is not None:
                return held
        found = await opening.answer(_open, request, run_id, get_hub(), get_guard())
        if isinstance(found, HttpResponse):
            return found
    opened, first = found
    # Caps and state come last (docs/design/api.md#check-order): here, on the event loop, the count is checked and
    # taken in one step; a 204 above never counted.
    watch = get_guard().take_slot(
        user_id=opened.user_id, token_id=opened.token_id, session_key=opened.session_key, run_id=opened.run_id
    )
    if watch is None:
        return error_response_for(too_many_streams())
    # The body gives the slot back when it ends; a client gone before the body ever ran leaves
    # it to the end of the request (guard.py says how, under each server).
    at_request_end(request, watch.release)
    stream = head if head is not None else _head()
    return stream.watched(watch, _stream(opened, watch, first))


def _head() -> WatchedResponse:
    """A stream's answer before its body: its status and headers."""
    stream = WatchedResponse(content_type="text/event-stream")
    stream["Cache-Control"] = "no-cache"
    stream["X-Accel-Buffering"] = "no"  # nginx: pass each frame on at once
    return stream


class _Opening:
    """The stream's opening in the middleware's one hop (runs/http/middleware.py `Opening`): its
    checks and first read on the opening threads, answered as `opening.answer` answers them, and the
    response phase over its refusal or its head. Not behind the edge, where the view first learns
    whether Pushpin holds the request and whose client a request Pushpin signed is (`edge_client`)."""

    def prepare(self, request: HttpRequest) -> tuple[Hub, StreamGuard] | None:
        return None if conf.GRIP_URL else (get_hub(), get_guard())

    def hop(self, fn: Callable[[], T]) -> Awaitable[T]:
        return opening.call(fn)

    def open(
        self, request: HttpRequest, prepared: tuple[Hub, StreamGuard], run_id: str
    ) -> tuple[HttpResponseBase, tuple[Opened, Read | None] | None]:
        found = opening.answer_here(_open, request, run_id, *prepared)
        return (found, None) if isinstance(found, HttpResponse) else (_head(), found)

    def failed(self, exc: Exception) -> HttpResponseBase:
        if isinstance(exc, DatabaseError | TimeoutError):
            return opening.unavailable()
        raise exc


run_stream.opening = _Opening()  # type: ignore[attr-defined]


def edge_client(request: HttpRequest) -> None:
    """The client of a request Pushpin signed is the last X-Forwarded-For entry: what the hop in
    front of Pushpin saw (runs/streaming/edge/pushpin.py `client_lines`), which no client can
    forge. The web processes Pushpin reaches on loopback trust no forwarded header, since any local
    user reaches that port too (docs/how-to/edge.md#front-door); so the address is taken here, for
    the throttle of token attempts, and only from a request whose signature holds."""
    forwarded = request.headers.get("X-Forwarded-For", "").rpartition(",")[2].strip()
    if forwarded and grip.signed_by_pushpin(request):
        request.META["REMOTE_ADDR"] = forwarded


def _open(request: HttpRequest, run_id: str, hub: Hub, guard: StreamGuard) -> tuple[Opened, Read | None] | HttpResponse:
    """The checks (`open_checks`), then in the same call on the opening thread the events after the
    cursor, if the stream is to start its run's feed here and is a short backlog behind, and its
    user has room for it: the stream's first bytes carry them, with no read of their own after.
    `hub` and `guard` are only looked at (from this thread, a hint: the event loop decides)."""
    # Before any read: the notes heard after it say what committed since (Hub.subscribe).
    mark = hub.recent.mark()
    opened = open_checks(request, run_id, SHORT_BACKLOG if run_id not in hub.feeds else 0, mark)
    if isinstance(opened, HttpResponse):
        return opened
    reads_first = (
        opened.types is None
        and opened.last_seq - opened.cursor <= SHORT_BACKLOG
        and opened.run_id not in hub.feeds
        and guard.has_room(opened.user_id)
    )
    if not reads_first:
        return opened, None
    # Read with the run where it could be (one round trip), else now.
    if opened.first is not None:
        return opened, frames_of(opened.first, SHORT_BACKLOG)
    return opened, read_frames_now(opened.run_id, opened.cursor, SHORT_BACKLOG)


async def _stream(opened: Opened, watch: Watch, first: Read | None) -> AsyncGenerator[bytes, None]:
    """The body: an async generator (a sync iterator would be buffered whole under ASGI).

    On a client disconnect Django cancels it (CancelledError at an await or yield); `finally`
    leaves the feed and gives the user's slot back, which is all the state a stream has. It ends by
    itself, always between whole frames, after the terminal event, at the end of its lifetime, or
    when the re-check ends its `watch`.
    """
    if not watch.start():
        return
    loop = asyncio.get_running_loop()
    cursor = opened.cursor
    types = opened.types
    keepalive = conf.SSE_KEEPALIVE_SECONDS
    lifetime = conf.SSE_MAX_SECONDS
    ends_at = loop.time() + lifetime if lifetime > 0 else math.inf
    hub = get_hub()
    # A new feed starts where the opening's read ended (`_open`), with what committed since from
    # the notes heard since, or a read at once if they cannot say (hub.py). Without that read, a
    # new feed of a live run starts at a short backlog's start: the pump's first read brings the
    # backlog with whatever committed since — one read where the watcher's own would be a second.
    # (An ended run's feed has no pump: its watchers read the table.)
    read_first = first.frames if first is not None else []
    mark = opened.mark
    if first is not None:
        head = read_first[-1].seq if read_first else cursor
        mark = None if first.full else mark  # more to read
    elif not opened.terminal and types is None and opened.last_seq - cursor <= SHORT_BACKLOG:
        head, mark = cursor, None
    else:
        head = opened.last_seq
    ended = opened.terminal or bool(read_first and read_first[-1].terminal)
    feed = hub.subscribe(opened.run_id, head=max(head, opened.last_seq) if ended else head, ended=ended, mark=mark)
    series.stream_opened()
    try:
        retry = f"retry: {conf.SSE_RETRY_MS}\n\n".encode()
        for chunk, after, done in _chunks(read_first, cursor):
            yield retry + chunk
            retry, cursor = b"", after
            if done:
                return
        if retry:
            yield retry
        next_keepalive = loop.time() + keepalive
        while not watch.ended:
            frames = feed.frames_after(cursor)
            if frames is None:
                try:
                    # A page is one frame of many events; chosen types need them one by one.
                    frames = await (feed.read(cursor) if types is None else _read_events(opened.run_id, cursor))
                except DatabaseError as exc:
                    # End the stream cleanly: the client reconnects with its Last-Event-ID.
                    log.warning("run %s: stream read failed (%s); ending the stream", opened.run_id, exc)
                    return
            if frames:
                done = False
                # Chosen types are picked here, per watcher, from the frames every watcher shares;
                # the cursor still passes the others, so a resume stays exact.
                passed = frames[-1].seq
                if types is not None:
                    frames = [frame for frame in frames if frame.type in types]
                for chunk, after, ended in _chunks(frames, cursor):
                    yield chunk
                    cursor, done = after, ended
                # The lifetime is looked at only after sending: each connection makes progress,
                # however short the lifetime and however long the backlog.
                if done or loop.time() >= ends_at:
                    return
                if frames:
                    next_keepalive = loop.time() + keepalive
                cursor = max(cursor, passed)
                continue
            now = loop.time()
            if now >= ends_at:
                return
            if now >= next_keepalive:
                yield KEEPALIVE
                next_keepalive = now + keepalive
                continue
            # No await since frames_after: an advance cannot have fallen between. The re-check
            # wakes a stream it ends (Watch.end); neither wait_for (a task per wait) nor a timeout
            # per wait: with a thousand watchers of one run each was a good share of the fan-out.
            waiter = feed.waiter()
            try:
                await watch.wait(waiter, min(next_keepalive, ends_at))
            finally:
                feed.drop(waiter)
    finally:
        hub.unsubscribe(feed)
        series.stream_closed()
        watch.release()


async def _read_events(run_id: str, cursor: int) -> list[Frame]:
    return (await read_frames(run_id, cursor)).frames


def _chunks(frames: list[Frame], cursor: int) -> Iterator[tuple[bytes, int, bool]]:
    """The frames after `cursor` up to and including a terminal one, as (bytes, cursor after
    them, ended): many small frames joined into one write, at most CHUNK_BYTES (or one frame) each,
    so that a watcher's copy of what it sends stays small whatever the events hold."""
    parts: list[bytes] = []
    size = 0
    for frame in frames:
        if frame.seq <= cursor:
            continue
        if parts and size + len(frame.data) > CHUNK_BYTES:
            yield b"".join(parts), cursor, False
            parts, size = [], 0
        parts.append(frame.data)
        size += len(frame.data)
        cursor = frame.seq
        if frame.terminal:
            yield b"".join(parts), cursor, True
            return
    if parts:
        yield b"".join(parts), cursor, False
