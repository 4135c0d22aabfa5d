"""A stream request that came through the edge (DESIGN §10): answered with the replay and hold
instructions, and no stream of its own.

Two kinds of request reach here, both signed by Pushpin (`grip.signed_by_pushpin`):

- **a client's connect**, with the client's credentials: checked exactly as a stream the web
  process serves itself (`runs.stream_checks`: 401, 404, 400, 204), but not counted against the
  user's cap of streams, which is about what one web process holds (DESIGN §5). The position is
  the client's `Last-Event-ID`, else `after_seq`.
- **Pushpin's recovery** (the GET of the next link after a gap, a link timeout or a recover),
  which carries no credential of any user: authorised by the signature alone, for the run of its
  path, at the position it gives in `Grip-Last` (never the link's query, which was fixed when the
  stream was first held).

The answer is an ordinary finite response — the events after the position, read from the table
— plus, while the run is live, hold instructions on the run's channel with the last id sent, so
Pushpin keeps the client and follows with what the publisher (`runs.edge.publisher`) sends. A
replay that reaches the terminal event ends there, without a hold: Pushpin ends the client's
stream, as a web process ends its own. The link is the stream's path without its query, the same
for every watcher of a run, so Pushpin can share one recovery GET among them.
"""

import asyncio

from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponse

from runs import streams
from runs.api.errors import error_response
from runs.cursors import plain_int
from runs.edge import grip
from runs.exceptions import NotFound
from runs.selectors import run_events_json_after, run_get
from runs.stream_checks import check, open_bound

# Events one answer replays at most. A longer backlog is sent in answers of this size that end
# the client's stream (no hold), and the client reconnects with its Last-Event-ID for the next.
REPLAY_MAX = 10 * streams.PAGE


async def respond(request: HttpRequest, run_id: str) -> HttpResponse | None:
    """The answer to a request Pushpin signed; None for any other (served as a plain stream)."""
    if not grip.signed_by_pushpin(request):
        return None
    link = request.path
    try:
        async with asyncio.timeout(open_bound()):
            if grip.is_recovery(request):
                position = grip.last_id(request, grip.channel(run_id))
                return await streams.run_open_check(_recover_sync, run_id, position, link)
            return await streams.run_open_check(_connect_sync, request, run_id, link)
    except (DatabaseError, TimeoutError):
        # Pushpin retries a failed recovery by itself (five times, backing off); a client retries.
        return error_response(503, "database_unavailable", "the database is unavailable; retry later")


def _connect_sync(request: HttpRequest, run_id: str, link: str) -> HttpResponse:
    # The checks and the replay on one borrowed connection: ten thousand watchers arriving
    # together is the edge's everyday load.
    try:
        opened = check(request, run_id)
        if isinstance(opened, HttpResponse):
            return opened
        return _answer(opened.run_id, opened.cursor, link, first=True)
    finally:
        connection.close()


def _recover_sync(run_id: str, position: str | None, link: str) -> HttpResponse:
    cursor = plain_int(position) if position is not None else None
    try:
        try:
            run = run_get(run_id=run_id)
        except NotFound:
            return _end()
        if cursor is None or cursor > run.last_seq or (run.is_terminal and cursor >= run.last_seq):
            # Nothing Pushpin could be waiting for: end the client's stream, and its reconnect
            # gets every check of a new one.
            return _end()
        return _answer(str(run.pk), cursor, link, first=False)
    finally:
        connection.close()


def _end() -> HttpResponse:
    # A 2xx without hold instructions ends the held stream; anything else Pushpin would retry.
    return HttpResponse(b"", content_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _answer(run_id: str, cursor: int, link: str, *, first: bool) -> HttpResponse:
    frames = _replay(run_id, cursor)
    parts = [f"retry: {int(settings.RUNLEDGER_SSE_RETRY_MS)}\n\n".encode()] if first else []
    last = cursor
    ended = False
    for frame in frames:
        parts.append(frame.data)
        last = frame.seq
        if frame.terminal:
            ended = True
            break
    response = HttpResponse(b"".join(parts), content_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    if not ended and len(frames) < REPLAY_MAX:
        for name, value in grip.hold_headers(name=grip.channel(run_id), prev_id=last, link=link).items():
            response[name] = value
    return response


def _replay(run_id: str, cursor: int) -> list[streams.Frame]:
    frames: list[streams.Frame] = []
    while len(frames) < REPLAY_MAX:
        page = [
            streams.make_frame(*row)
            for row in run_events_json_after(run_id=run_id, after_seq=cursor, limit=streams.PAGE)
        ]
        frames += page
        if len(page) < streams.PAGE or page[-1].terminal:
            break
        cursor = page[-1].seq
    return frames
