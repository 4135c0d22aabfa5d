"""The SSE stream of a run's events (DESIGN §5): a plain async view, read-only.

`GET /api/runs/{id}/stream/?after_seq=N` replays the stored events with seq > N, then follows new
ones live until the terminal event. The cursor is the `Last-Event-ID` header when given (what
`EventSource` sends on reconnect), else `after_seq`, else 0, and each SSE `id:` is the bare seq,
so a reconnect resumes exactly after the last event the client fully received. Where the frames
come from, and how many watchers share one read, is `runs.streams`.

Checks run in the order of DESIGN §6: authentication (401; 429 for an address with too many failed
token attempts, runs.api.authentication), visibility (404), cursor (400), state (204 for a finished
run already read to its end, 400 for a cursor past a live run's end), then the user's cap of
streams in this process (429; `runs.stream_guard`, which also ends open streams whose user,
credential or sight of the run is gone). A stream ends cleanly after `RUNLEDGER_SSE_MAX_SECONDS`,
between whole frames: the client reconnects with its Last-Event-ID. Closing the stream only stops
this generator: nothing here writes, but for the count of a failed token attempt.
"""

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import cast

from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from runs import streams
from runs.access import AnyUser, User
from runs.api.authentication import TokenAuthentication
from runs.api.errors import error_response, error_response_for
from runs.cursors import plain_int
from runs.exceptions import NotFound, TooManyRequests
from runs.limits import limit, retry_after
from runs.metrics import series
from runs.selectors import run_get
from runs.stream_guard import Watch, get_guard, release_at_request_end

log = logging.getLogger(__name__)

KEEPALIVE = b": keep-alive\n\n"


@dataclass(frozen=True)
class _Opened:
    run_id: str
    cursor: int
    last_seq: int
    terminal: bool
    # Who opened it, and with what: the re-check looks at them again (runs.stream_guard).
    user_id: int
    token_key: str | None
    session_key: str | None


def _parse_cursor(name: str, value: str) -> int | HttpResponse:
    cursor = plain_int(value)
    if cursor is None:
        return error_response(
            400, "validation_error", f"{name} must be an integer >= 0", {name: [f"{value!r} is not an integer >= 0"]}
        )
    return cursor


def _authenticate(request: HttpRequest) -> tuple[User, str | None, str | None] | None:
    """DRF's token header (programs), else the session (browsers: EventSource sends no headers):
    (user, token key, session key), one of the keys set."""
    try:
        found = TokenAuthentication().authenticate(Request(request))
    except AuthenticationFailed:
        return None  # a bad token is not silently downgraded to the session
    if found is not None:
        return cast(User, found[0]), found[1].key, None
    user = cast(AnyUser, request.user)
    return (user, None, request.session.session_key) if isinstance(user, User) and user.is_authenticated else None


def _open(request: HttpRequest, run_id: str) -> _Opened | HttpResponse:
    """Every check before streaming, in one short synchronous call on the stream-opening pool."""
    try:
        try:
            authenticated = _authenticate(request)
        except TooManyRequests as exc:
            return error_response_for(exc)
        if authenticated is None:
            response = error_response(401, "not_authenticated", "authentication credentials were not provided")
            response["WWW-Authenticate"] = "Token"
            return response
        user, token_key, session_key = authenticated
        try:
            run = run_get(run_id=run_id, user=user)
        except NotFound as exc:
            return error_response_for(exc)
        if request.method != "GET":
            # After authentication and visibility, like the rest of the API (DESIGN §6's order).
            not_allowed = error_response(405, "method_not_allowed", f"method {request.method} is not allowed")
            not_allowed["Allow"] = "GET"
            return not_allowed
        cursor, cursor_name = 0, "after_seq"
        for name, value in (("after_seq", request.GET.get("after_seq")), ("Last-Event-ID", _last_event_id(request))):
            if value is not None:
                parsed = _parse_cursor(name, value)
                if isinstance(parsed, HttpResponse):
                    return parsed
                cursor, cursor_name = parsed, name  # the header comes second, so it wins
        if run.is_terminal and cursor >= run.last_seq:
            # The HTML spec's way to make EventSource stop reconnecting: nothing more will come.
            return HttpResponse(status=204, headers={"Cache-Control": "no-cache"})
        if cursor > run.last_seq:
            return error_response(
                400,
                "validation_error",
                f"cursor {cursor} is past the run's last event {run.last_seq}",
                {cursor_name: [f"must be at most {run.last_seq}"]},
            )
        return _Opened(
            run_id=str(run.pk),
            cursor=cursor,
            last_seq=run.last_seq,
            terminal=run.is_terminal,
            user_id=int(user.pk),
            token_key=token_key,
            session_key=session_key,
        )
    finally:
        # Streams live long; the connection this check used must not live with them.
        connection.close()


def _open_bound() -> float:
    """Seconds a stream request may take to pass its checks: a connect timeout for the check
    itself, and a little more for its turn on the threads."""
    options = connection.settings_dict.get("OPTIONS", {})
    return float(options.get("connect_timeout", options.get("timeout", 3))) + 2.0


def _last_event_id(request: HttpRequest) -> str | None:
    # EventSource sends the header only when it has an id; an empty one means "none yet".
    return request.headers.get("Last-Event-ID") or None


# Read-only whatever the method, so CSRF protects nothing here; exempt, a POST gets the JSON 405
# once authenticated and shown a visible run.
@csrf_exempt
async def run_stream(request: HttpRequest, run_id: str) -> HttpResponseBase:
    try:
        # Bounded, queue included: the checks share a few threads, and while the database does not
        # answer each check waits out the connect timeout, so a reconnect storm would otherwise
        # wait in line for minutes. A check still queued at the bound is dropped, never run.
        async with asyncio.timeout(_open_bound()):
            opened = await streams.run_open_check(_open, request, run_id)
    except (DatabaseError, TimeoutError):
        return error_response(503, "database_unavailable", "the database is unavailable; retry later")
    if isinstance(opened, HttpResponse):
        return opened
    # Caps and state come last (DESIGN §6): here, on the event loop, the count is checked and
    # taken in one step; a 204 above never counted.
    watch = get_guard().admit(
        user_id=opened.user_id, token_key=opened.token_key, session_key=opened.session_key, run_id=opened.run_id
    )
    if watch is None:
        cap = limit("RUNLEDGER_MAX_STREAMS_PER_USER")
        return error_response_for(
            TooManyRequests(
                f"at most {cap} streams at once per user on this server; close one or retry later",
                retry_after=retry_after(),
                detail={"limit": cap},
            )
        )
    # The body gives the slot back when it ends; a client gone before the body ever ran leaves
    # it to the end of the request.
    release_at_request_end(request, watch.release)
    stream = StreamingHttpResponse(_stream(opened, watch), content_type="text/event-stream")
    stream["Cache-Control"] = "no-cache"
    stream["X-Accel-Buffering"] = "no"  # nginx: pass each frame on at once
    return stream


async def _stream(opened: _Opened, watch: Watch) -> AsyncIterator[bytes]:
    """The body: an async generator (a sync iterator would be buffered whole under ASGI).

    On a client disconnect Django cancels it (CancelledError at an await or yield); `finally`
    leaves the feed and gives the user's slot back, which is all the state a stream has. It ends by
    itself, always between whole frames, after the terminal event, at the end of its lifetime, or
    when the re-check ends its `watch`.
    """
    loop = asyncio.get_running_loop()
    keepalive = float(settings.RUNLEDGER_SSE_KEEPALIVE_SECONDS)
    lifetime = float(settings.RUNLEDGER_SSE_MAX_SECONDS)
    ends_at = loop.time() + lifetime if lifetime > 0 else math.inf
    hub = streams.get_hub()
    feed = hub.subscribe(opened.run_id, head=opened.last_seq, ended=opened.terminal)
    cursor = opened.cursor
    series.SSE_STREAMS_OPEN.inc()
    try:
        yield f"retry: {int(settings.RUNLEDGER_SSE_RETRY_MS)}\n\n".encode()
        next_keepalive = loop.time() + keepalive
        while not watch.ended:
            changed = feed.changed
            frames = feed.frames_after(cursor)
            if frames is None:
                try:
                    frames = await feed.read(cursor)
                except DatabaseError as exc:
                    # End the stream cleanly: the client reconnects with its Last-Event-ID.
                    log.warning("run %s: stream read failed (%s); ending the stream", opened.run_id, exc)
                    return
            if frames:
                chunk, cursor, done = _take(frames, cursor)
                if chunk:
                    yield chunk
                # The lifetime is looked at only after sending: each connection makes progress,
                # however short the lifetime and however long the backlog.
                if done or loop.time() >= ends_at:
                    return
                next_keepalive = loop.time() + keepalive
                continue
            now = loop.time()
            if now >= ends_at:
                return
            if now >= next_keepalive:
                yield KEEPALIVE
                next_keepalive = now + keepalive
                continue
            # asyncio.timeout, not wait_for: wait_for wraps the wait in a new task each time, and
            # with a thousand watchers of one run that was a good share of each event's fan-out.
            # The re-check wakes a stream it ends by moving this bound to now (Watch.end).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(min(next_keepalive, ends_at)) as bound:
                    watch.waiting = bound
                    try:
                        await changed.wait()
                    finally:
                        watch.waiting = None
    finally:
        hub.unsubscribe(feed)
        series.SSE_STREAMS_OPEN.dec()
        watch.release()


def _take(frames: list[streams.Frame], cursor: int) -> tuple[bytes, int, bool]:
    """The frames after `cursor` up to and including a terminal one: (bytes, new cursor, ended)."""
    parts: list[bytes] = []
    for frame in frames:
        if frame.seq <= cursor:
            continue
        parts.append(frame.data)
        cursor = frame.seq
        if frame.terminal:
            return b"".join(parts), cursor, True
    return b"".join(parts), cursor, False
