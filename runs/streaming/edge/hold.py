"""The streams the edge holds (docs/design/edge.md#hold): a client's connect through Pushpin, checked
as a stream the web process serves itself and answered with the replay and hold instructions
(`respond`), and Pushpin's fetches of the stream's link, answered the same way or with the
stream's end (`recover`).
"""

import logging
import math
import time

from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from runs.conf import conf
from runs.cursors import plain_int
from runs.exceptions import NotFound
from runs.http.errors import error_response, error_response_for
from runs.models import TERMINAL_VALUES
from runs.selectors import run_event_sizes
from runs.selectors.states import run_status_last_seq
from runs.selectors.wire import run_events_json_after
from runs.streaming import hub, opening
from runs.streaming.checks import Opened, open_checks
from runs.streaming.edge import grip, publisher
from runs.streaming.edge.link import Link, mint, read
from runs.streaming.guard import EDGE_MARGIN, edge_streams, get_guard, too_many_streams

log = logging.getLogger(__name__)

# Events one answer replays at most, and about as many bytes: a longer backlog is sent in answers
# of this size that end the client's stream (no hold), and the client reconnects with its
# Last-Event-ID for the next.
REPLAY_MAX = 10 * hub.PAGE
REPLAY_MAX_BYTES = 5_000_000
# What a frame adds to its event's data, beyond twice its type (`id:`, `event:`, the JSON around).
FRAME_EXTRA = 160


async def respond(request: HttpRequest, run_id: str) -> HttpResponse | None:
    """The answer to a client's connect Pushpin signed; None for any other (served as a plain stream)."""
    # Under runs.asgi the publisher started with the process; under Django's own handler, which
    # has no lifespan, it starts here, with the first stream request (a no-op once running).
    publisher.start()
    if not grip.signed_by_pushpin(request):
        return None
    # This loop's own streams of each user, read (not changed) from the opening thread.
    plain = get_guard().counts
    return await opening.answer(_connect_sync, request, run_id, plain)


@csrf_exempt
def recover(request: HttpRequest, run_id: str) -> HttpResponse:
    """Pushpin's fetch of a held stream's link.

    Synchronous, unlike the connect: runs.asgi then runs it as it runs the API, the middleware
    chain and the view in one call on a request thread, where an async view pays a hop between
    the event loop and a thread for each synchronous middleware step (about a dozen). Fetches are
    short reads, and ten thousand streams make one every few milliseconds; Pushpin retries a
    failed one by itself."""
    position = grip.last_id(request, grip.channel(run_id))
    token = grip.last_id(request, grip.LINK_CHANNEL)
    if (
        not conf.GRIP_URL
        or request.method != "GET"
        or position is None
        or token is None
        or not grip.signed_by_pushpin(request)
    ):
        return _not_pushpins(request)
    publisher.start_from_thread()
    found = read(run_id=run_id, token=token)
    if found is None:
        log.warning("run %s: a link fetch signed by Pushpin with a token not minted for this run", run_id)
        return _end()
    try:
        return _recover_sync(found, token, position, request.path)
    except DatabaseError:
        # Pushpin retries a failed fetch by itself (five times, backing off).
        return opening.unavailable()


def _not_pushpins(request: HttpRequest) -> HttpResponse:
    """Only Pushpin fetches links: to a client with a credential of a user this path does not
    exist (404), and one without any is asked for one like on every API path (401) — but no user's
    credential is ever checked here."""
    if "Authorization" in request.headers or settings.SESSION_COOKIE_NAME in request.COOKIES:
        return error_response_for(NotFound("not found"))
    response = error_response(401, "not_authenticated", "authentication credentials were not provided")
    response["WWW-Authenticate"] = "Token"
    return response


def _connect_sync(request: HttpRequest, run_id: str, plain: dict[int, int]) -> HttpResponse:
    # The checks and the replay on one borrowed connection: ten thousand watchers arriving
    # together is the edge's everyday load.
    opened = open_checks(request, run_id)
    if isinstance(opened, HttpResponse):
        return opened
    return _connect(request, opened, plain)


def _connect(request: HttpRequest, opened: Opened, plain: dict[int, int]) -> HttpResponse:
    lifetime = conf.SSE_MAX_SECONDS
    now = time.time()
    held = Link(
        run_id=opened.run_id,
        user_id=opened.user_id,
        token_id=opened.token_id,
        session_key=opened.session_key,
        expires=math.ceil(now + lifetime) if lifetime > 0 else 0,
    )
    token = mint(held)
    timeout = grip.link_timeout(seconds_left=_seconds_left(held, now), first=True)
    # Counted first, before the replay is read: a refused connect costs no read. A finished run's
    # stream ends with its replay, so it holds nothing.
    counted = not opened.terminal
    if counted and not edge_streams.take_slot(
        user_id=held.user_id, link=token, run_id=held.run_id, until=_until(timeout), plain=plain.get(held.user_id, 0)
    ):
        return error_response_for(too_many_streams())
    frames, complete = _replay(opened.run_id, opened.cursor)
    body = _body(frames, first=True)
    if not complete or (frames and frames[-1].terminal):
        if counted:
            edge_streams.drop(user_id=held.user_id, link=token)
        return body
    # The link: the same for every stream of the run, so Pushpin fetches them in batches.
    link = f"{request.path}link/"
    return _hold(body, held, last=frames[-1].seq if frames else opened.cursor, link=link, token=token, timeout=timeout)


def _recover_sync(found: Link, token: str, position: str, link: str) -> HttpResponse:
    try:
        answer = _recover(found, token, position, link)
        if answer.get("Grip-Hold") is None:
            edge_streams.drop(user_id=found.user_id, link=token)
        return answer
    finally:
        connection.close()


def _recover(found: Link, token: str, position: str, link: str) -> HttpResponse:
    now = time.time()
    left = _seconds_left(found, now)
    if not edge_streams.allowed(found.holder):
        log.info("run %s: ending an edge stream of user %s, who may no longer hold it", found.run_id, found.user_id)
        return _end()
    cursor = plain_int(position)
    # The run's status and last seq, not the run: most fetches (every link timeout of every held
    # stream) find nothing new, and this is all they read.
    row = run_status_last_seq(run_id=found.run_id)
    if row is None:
        return _end()
    status, last_seq = row
    if cursor is None or cursor > last_seq or (status in TERMINAL_VALUES and cursor >= last_seq):
        # Nothing Pushpin could be waiting for: end the client's stream, and its reconnect gets
        # every check of a new one.
        return _end()
    frames, complete = _replay(found.run_id, cursor) if cursor < last_seq else ([], True)
    body = _body(frames, first=False)
    # At the stream's lifetime too, what it missed goes first (a fetch at expiry can be the first
    # to see a gap, docs/design/edge.md#late-holds), then its end: the client reconnects, checked anew.
    if not complete or (frames and frames[-1].terminal) or (left is not None and left <= 0):
        return body
    timeout = grip.link_timeout(seconds_left=left, first=False)
    edge_streams.seen(user_id=found.user_id, link=token, run_id=found.run_id, until=_until(timeout))
    return _hold(body, found, last=frames[-1].seq if frames else cursor, link=link, token=token, timeout=timeout)


def _seconds_left(found: Link, now: float) -> float | None:
    return found.expires - now if found.expires else None


def _until(timeout: int) -> float:
    """Until when a stream held with this link timeout counts, unless its link is fetched again."""
    return time.monotonic() + timeout + EDGE_MARGIN


def _end() -> HttpResponse:
    # A 2xx without hold instructions ends the held stream; anything else Pushpin would retry.
    return HttpResponse(b"", content_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _body(frames: list[hub.Frame], *, first: bool) -> HttpResponse:
    parts = [f"retry: {conf.SSE_RETRY_MS}\n\n".encode()] if first else []
    parts += [frame.data for frame in frames]
    return HttpResponse(b"".join(parts), content_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _hold(response: HttpResponse, held: Link, *, last: int, link: str, token: str, timeout: int) -> HttpResponse:
    channel = grip.channel(held.run_id)
    headers = grip.hold_headers(
        name=channel, prev_id=last, user_id=held.user_id, link=link, token=token, timeout=timeout
    )
    for name, value in headers.items():
        response[name] = value
    return response


def _replay(run_id: str, cursor: int) -> tuple[list[hub.Frame], bool]:
    """The frames after `cursor` up to the terminal one, at most REPLAY_MAX and about
    REPLAY_MAX_BYTES (at least one), and whether they reach the last event stored. The sizes are
    read first, so what is read is bounded whatever the rows hold."""
    upto, total, complete = cursor, 0, True
    for seq, size in run_event_sizes(run_id=run_id, after_seq=cursor, limit=REPLAY_MAX + 1):
        total += size + FRAME_EXTRA
        if seq - cursor > REPLAY_MAX or (upto > cursor and total > REPLAY_MAX_BYTES):
            complete = False
            break
        upto = seq
    if upto == cursor:
        return [], complete
    frames = [
        hub.make_frame(*row) for row in run_events_json_after(run_id=run_id, after_seq=cursor, limit=upto - cursor)
    ]
    for i, frame in enumerate(frames):
        if frame.terminal:
            return frames[: i + 1], True
    return frames, complete
