"""A page of a run's events as the one text it is sent as: SSE frames for a stream's replay, the
items of a JSON page, and the JSON page itself (docs/design/streaming.md#json-pages), which the
API answers. Each event's JSON is
`runs.selectors.event_json`'s bytes (`run_events_json_bounded`, where PostgreSQL makes most of it);
a page is joined here once, so that a replay moves one string per page instead of an object per
event.
"""

import json
from dataclasses import dataclass
from uuid import UUID

from runs.conf import conf
from runs.events import TERMINAL_EVENT_TYPES, TypeSelection
from runs.exceptions import ValidationFailed
from runs.models import Run
from runs.selectors import run_events_json_bounded
from runs.transitions import is_terminal

# The events a JSON page holds unless asked for fewer, and the most it may be asked for; and at
# most RUNLEDGER_MAX_PAGE_BYTES of them whatever the count.
EVENTS_PAGE_LIMIT = 100
EVENTS_PAGE_MAX_LIMIT = 1000


def sse_frame(seq: int, type_: str, body: str) -> str:
    """The SSE frame of the event `seq` of type `type_` whose JSON (`event_json`) is `body`.

    `id:` is its last field (docs/design/streaming.md#frames): a client that takes the id as it
    parses the line rather than when it dispatches the event, as fetch-event-source does, has then
    read the whole event first, so a connection cut inside a frame costs it nothing on resume."""
    # A line break in the type would end the field early; JSON never contains one unescaped.
    field = type_.replace("\r", " ").replace("\n", " ")
    return f"event: {field}\ndata: {body}\nid: {seq}\n\n"


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


@dataclass(frozen=True)
class EventsPage:
    # The events' JSON texts joined by "," (`runs.selectors.event_json`, the bytes SSE sends too).
    items: str
    next_after_seq: int
    last_seq: int
    run_status: str
    end_of_stream: bool

    def json(self) -> str:
        """The page as its answer's body. The events are already JSON (the bytes SSE sends),
        spliced in rather than decoded and serialised field by field again — that took most of a
        100k-event catch-up's time."""
        rest = {
            "next_after_seq": self.next_after_seq,
            "last_seq": self.last_seq,
            "run_status": self.run_status,
            "end_of_stream": self.end_of_stream,
        }
        return '{"results":[' + self.items + "]," + json.dumps(rest, separators=(",", ":"))[1:]


def run_events_page(*, run: Run, after_seq: int, limit: int, types: TypeSelection | None = None) -> EventsPage:
    """Events with seq > after_seq (docs/design/streaming.md#json-pages) of a run the caller may
    see: at most `limit`, and at most RUNLEDGER_MAX_PAGE_BYTES of them (one at least); with
    `types`, only those of the chosen types (docs/design/streaming.md#types)."""
    if after_seq > run.last_seq:
        raise ValidationFailed(
            f"after_seq {after_seq} is past the run's last event ({run.last_seq})",
            detail={"after_seq": [f"must be at most {run.last_seq}"]},
        )
    page = run_events_items(run_id=run.pk, after_seq=after_seq, limit=limit, max_bytes=conf.MAX_PAGE_BYTES, types=types)
    # The run's state is read with its events (one snapshot), else after them: either way last_seq
    # covers every event returned, and a terminal status means the terminal event is stored, so
    # end_of_stream is never early.
    status, last_seq = page.run_state or Run.objects.filter(pk=run.pk).values_list("status", "last_seq").get()
    next_after_seq = after_seq if page.last_seq is None else page.last_seq
    return EventsPage(
        items=page.text,
        next_after_seq=next_after_seq,
        last_seq=last_seq,
        run_status=status,
        end_of_stream=is_terminal(status) and next_after_seq >= last_seq,
    )
