"""The checks that open a stream of a run's events (docs/design/streaming.md#auth), shared by the streams a web
process serves itself (views.py) and those the edge holds (edge/hold.py).

In the order of docs/design/api.md#check-order: authentication (401; 429 for an address with too many failed token
attempts, runs.http.authentication), visibility (404), method (405), cursor (400), state (204 for a
finished run already read to its end, 400 for a cursor past a live run's end). The cap of streams
per user comes after these (guard.py), for the streams the edge holds too.
"""

from dataclasses import dataclass

from django.http import HttpRequest, HttpResponse

from runs.access import User
from runs.agents import declared_types
from runs.conf import conf
from runs.cursors import plain_int
from runs.events import TypeSelection, type_selection
from runs.exceptions import NotFound, TooManyRequests, ValidationFailed
from runs.http.authentication import request_credentials
from runs.http.errors import error_response, error_response_for
from runs.models import Run
from runs.selectors import run_get, run_get_with_events
from runs.selectors.wire import EventsRead


@dataclass(frozen=True)
class Opened:
    run_id: str
    cursor: int
    last_seq: int
    terminal: bool
    # Who opened it, and with what: the re-check looks at them again (guard.py).
    user_id: int
    token_id: int | None
    session_key: str | None
    # The types the stream sends (docs/design/streaming.md#types); None: every one.
    types: TypeSelection | None = None
    # The events after the cursor, read in the run's round trip (`open_checks`'s `first_rows`).
    first: EventsRead | None = None
    # Where the hub's recent notes stood before the run was read (runs.streaming.recent `mark`).
    mark: int | None = None


def parse_cursor(name: str, value: str) -> int | HttpResponse:
    cursor = plain_int(value)
    if cursor is None:
        return error_response(
            400, "validation_error", f"{name} must be an integer >= 0", {name: [f"{value!r} is not an integer >= 0"]}
        )
    return cursor


def cursor_named(request: HttpRequest) -> tuple[int, str] | HttpResponse:
    """The cursor a stream starts after, and the name it came as (`Last-Event-ID` wins over
    `after_seq`); 0 without one; the 400 for one that is not a number."""
    cursor, cursor_name = 0, "after_seq"
    for name, value in (("after_seq", request.GET.get("after_seq")), ("Last-Event-ID", last_event_id(request))):
        if value is not None:
            parsed = parse_cursor(name, value)
            if isinstance(parsed, HttpResponse):
                return parsed
            cursor, cursor_name = parsed, name  # the header comes second, so it wins
    return cursor, cursor_name


@dataclass(frozen=True)
class Reader:
    """Who asked to read a run, with what, and the run as read then."""

    run: Run
    user: User
    token_id: int | None
    session_key: str | None
    # The events after a cursor, read with the run (`read_checks`'s `first`).
    first: EventsRead | None = None


def read_checks(request: HttpRequest, run_id: str, first: tuple[int, int] | None = None) -> Reader | HttpResponse:
    """The first checks of a read that waits (a stream, a wait): authentication, visibility, method.
    `first`: (cursor, rows): the events after that cursor, at most so many, read in the run's round
    trip where it can be (`run_get_with_events`)."""
    try:
        authenticated = request_credentials(request)
    except TooManyRequests as exc:
        return error_response_for(exc)
    if authenticated is None:
        response = error_response(401, "not_authenticated", "authentication credentials were not provided")
        response["WWW-Authenticate"] = "Token"
        return response
    user, token_id, session_key = authenticated
    read = None
    try:
        if first is None:
            run = run_get(run_id=run_id, user=user)
        else:
            after, rows = first
            run, read = run_get_with_events(
                run_id=run_id, user=user, after_seq=after, limit=rows, max_bytes=conf.MAX_PAGE_BYTES
            )
    except NotFound as exc:
        return error_response_for(exc)
    if request.method != "GET":
        # After authentication and visibility, like the rest of the API (docs/design/api.md#check-order).
        not_allowed = error_response(405, "method_not_allowed", f"method {request.method} is not allowed")
        not_allowed["Allow"] = "GET"
        return not_allowed
    return Reader(run=run, user=user, token_id=token_id, session_key=session_key, first=read)


def open_checks(
    request: HttpRequest, run_id: str, first_rows: int = 0, mark: int | None = None
) -> Opened | HttpResponse:
    """Every check that opens a stream, in order, or the answer that refuses it; run on the opening
    threads (opening.py), which close the connection it used. `first_rows`: for a stream of every
    type, the events after its cursor, at most so many, read with the run (`Opened.first`), for the
    caller to use if it wants them. `mark`: the hub's recent notes' mark, read before this."""
    named = cursor_named(request)
    every_type = not request.GET.get("types")
    first = (named[0], first_rows) if first_rows and every_type and not isinstance(named, HttpResponse) else None
    reader = read_checks(request, run_id, first)
    if isinstance(reader, HttpResponse):
        return reader
    run, user = reader.run, reader.user
    types = None
    if spec := request.GET.get("types"):  # empty, as a form leaves it: every event
        try:
            types = type_selection(spec, declared_types(run.agent))
        except ValidationFailed as exc:
            return error_response_for(exc)
    if isinstance(named, HttpResponse):
        return named
    cursor, cursor_name = named
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
    return Opened(
        run_id=str(run.pk),
        cursor=cursor,
        last_seq=run.last_seq,
        terminal=run.is_terminal,
        user_id=int(user.pk),
        token_id=reader.token_id,
        session_key=reader.session_key,
        types=types,
        first=reader.first,
        mark=mark,
    )


def last_event_id(request: HttpRequest) -> str | None:
    # EventSource sends the header only when it has an id; an empty one means "none yet".
    return request.headers.get("Last-Event-ID") or None
