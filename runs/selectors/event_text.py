"""A page of a run's events as the one text it is sent as: SSE frames for a stream's replay, the
items of a JSON page. Each event's JSON is `runs.selectors.event_json`'s bytes
(`run_events_json_bounded`, where PostgreSQL makes most of it); a page is joined here once, so
that a replay moves one string per page instead of an object per event.
"""

from dataclasses import dataclass
from uuid import UUID

from runs.events import TERMINAL_EVENT_TYPES, TypeSelection
from runs.selectors import run_events_json_bounded


def sse_frame(seq: int, type_: str, body: str) -> str:
    """The SSE frame of the event `seq` of type `type_` whose JSON (`event_json`) is `body`."""
    # A line break in the type would end the field early; JSON never contains one unescaped.
    field = type_.replace("\r", " ").replace("\n", " ")
    return f"id: {seq}\nevent: {field}\ndata: {body}\n\n"


@dataclass(frozen=True)
class EventsText:
    """Events after a cursor as one text, at most so many rows and so many bytes."""

    # The events, each as its SSE frame (`run_events_frames`) or its JSON (`run_events_items`,
    # joined by ","), in seq order.
    text: str
    count: int
    # The last event's seq (None: no event).
    last_seq: int | None
    # The last event is a terminal one.
    terminal: bool
    # The byte bound stopped the read before the row bound or the stored events did: more follow.
    cut: bool
    # The run's (status, last_seq) read with the events, when they were (`EventsRead.run_state`).
    run_state: tuple[str, int] | None = None


def _page(
    run_id: UUID | str,
    after_seq: int,
    limit: int,
    max_bytes: int | None,
    *,
    frames: bool,
    types: TypeSelection | None = None,
) -> EventsText:
    read = run_events_json_bounded(run_id=run_id, after_seq=after_seq, limit=limit, max_bytes=max_bytes, types=types)
    text = "".join([sse_frame(*row) for row in read.rows]) if frames else ",".join([row[2] for row in read.rows])
    last = read.rows[-1] if read.rows else None
    return EventsText(
        text=text,
        count=len(read.rows),
        last_seq=last[0] if last else None,
        terminal=last is not None and last[1] in TERMINAL_EVENT_TYPES,
        cut=read.cut,
        run_state=read.run_state,
    )


def run_events_frames(*, run_id: UUID | str, after_seq: int, limit: int, max_bytes: int | None) -> EventsText:
    """The events with seq > after_seq as their SSE frames, joined: at most `limit` and, with
    `EVENT_ENVELOPE_BYTES` each, at most `max_bytes` (None: no byte bound); one at least."""
    return _page(run_id, after_seq, limit, max_bytes, frames=True)


def run_events_items(
    *, run_id: UUID | str, after_seq: int, limit: int, max_bytes: int | None, types: TypeSelection | None = None
) -> EventsText:
    """`run_events_frames` as the items of a JSON page: each event's JSON, joined by ","; with
    `types`, only the events of those types."""
    return _page(run_id, after_seq, limit, max_bytes, frames=False, types=types)
