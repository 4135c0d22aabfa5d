"""The event wire format's one home (docs/design/streaming.md#wire): an event's JSON (`event_json`),
the SQL codec that has PostgreSQL write most of it (`run_events_json_bounded`), SSE frames
(`sse_frame`) and the pages joined from them (`run_events_frames`, `run_events_page`). Every stream,
page and edge publish sends these bytes."""

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.db import connection
from django.db.models import Q
from django.db.models.functions import Coalesce, Length

from runs.conf import conf
from runs.events import TERMINAL_EVENT_TYPES, TypeSelection
from runs.exceptions import ValidationFailed
from runs.models import Run, RunEvent
from runs.prepared import prepared_cursor
from runs.transitions import is_terminal


def run_events_after(*, run_id: UUID | str, after_seq: int, limit: int) -> list[RunEvent]:
    """Stored events with seq > after_seq, in order — the only source of every stream and page."""
    return list(RunEvent.objects.filter(run_id=run_id, seq__gt=after_seq).order_by("seq")[:limit])


# The event object (docs/design/events.md#event-object) as compact JSON: the bytes of SSE `data:`
# and of a JSON page's items.
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def event_json(event: RunEvent) -> str:
    return _encode(event.as_dict())


# The codec (docs/design/streaming.md#wire): PostgreSQL writes each row's `created_at` as
# `RunEvent.as_dict` does, and its `data` compact when that is exactly what Python's encoder would
# write (`plain`); NOT_PLAIN finds the data that is not — a string holding ", " or ": ", a number
# with a fraction — whose text goes through Python. A page after N is the range (N, N + limit]
# (seqs are gap-free), so it reads `limit` rows whatever plan PostgreSQL picks.
_STRING = r'"(?:[^"\\]|\\.)*"'
NOT_PLAIN = rf'^(?:[^".]|{_STRING})*(?:\.|"(?:[^"\\]|\\.)*(?:, |: ))'
EVENT_COLUMNS = """seq, type, CASE WHEN plain THEN replace(replace(data, ', ', ','), ': ', ':') ELSE data END, plain,
    to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'), attempt"""
# OFFSET 0 keeps the inner query whole, so each row's data is printed once, not once per use.
# The rows the codec reads, parameters (NOT_PLAIN, run, after, upto): a range of a run's events.
_EVENTS_RANGE = (
    "SELECT seq, type, data::text AS data, data::text !~ %s AS plain, created_at, attempt"
    f" FROM {RunEvent._meta.db_table} WHERE run_id = %s AND seq > %s AND seq <= %s"
)
_EVENTS_JSON_SQL = f"SELECT {EVENT_COLUMNS} FROM ({_EVENTS_RANGE} ORDER BY seq LIMIT %s OFFSET 0) page ORDER BY seq"


# The most a notification's events may take (PostgreSQL refuses a payload of 8000 bytes or more,
# and the rest of it is a run id and a number), counted first by their stored sizes with
# EVENT_ENVELOPE_BYTES each: a bigger write (a batch of an agent's output) sends no events, and its
# readers read. The database checks the size of what it wrote too.
CARRIED_EVENTS_BYTES = 7500
_CARRIED_EVENTS_SQL = f"""COALESCE((
    SELECT E'\\n' || carried FROM (
        SELECT json_agg(json_build_array({EVENT_COLUMNS}) ORDER BY seq)::text AS carried
        FROM ({_EVENTS_RANGE} OFFSET 0) page
    ) events WHERE octet_length(carried) <= {CARRIED_EVENTS_BYTES}
), '')"""


def carried_events_sql(run_id: UUID, rows: Sequence[RunEvent]) -> tuple[str, list[Any]] | None:
    """The expression that writes `rows`, the run's events this transaction inserts, into its
    notification (runs.notify `events_committed`), sent after them: the rows of
    `run_events_json_after`, as JSON. None when they would not fit."""
    if not rows or sum((row.data_bytes or 0) + EVENT_ENVELOPE_BYTES for row in rows) > CARRIED_EVENTS_BYTES:
        return None
    return _CARRIED_EVENTS_SQL, [NOT_PLAIN, run_id, rows[0].seq - 1, rows[-1].seq]


def carried_events_rows(carried: str) -> list[tuple[int, str, str]]:
    """The events a notification carried (`carried_events_sql`): the rows, and so the bytes, that
    `run_events_json_after` reads."""
    return json_rows(json.loads(carried))


def run_events_json_after(*, run_id: UUID | str, after_seq: int, limit: int) -> list[tuple[int, str, str]]:
    """`run_events_after` as (seq, type, `event_json`) rows: the hot path of streams and pages,
    which only send the events on. The same bytes as `event_json(event)` on every backend."""
    if connection.vendor != "postgresql":
        return [
            (e.seq, e.type, event_json(e)) for e in run_events_after(run_id=run_id, after_seq=after_seq, limit=limit)
        ]
    with prepared_cursor() as cursor:
        cursor.execute(_EVENTS_JSON_SQL, [NOT_PLAIN, run_id, after_seq, after_seq + limit, limit])
        return json_rows(cursor.fetchall())


def json_rows(rows: Iterable[Sequence[Any]]) -> list[tuple[int, str, str]]:
    # The object of `event_json` written out field by field (its bytes exactly: the same keys in
    # the same order, compact): only data PostgreSQL could not make compact goes through the codec.
    return [
        (
            seq,
            type_,
            f'{{"seq":{seq},"type":{_encode(type_)},"data":{data if plain else _encode(json.loads(data))},'
            f'"created_at":"{created_at.removesuffix(".000000")}Z","attempt":{"null" if attempt is None else attempt}}}',
        )
        for seq, type_, data, plain, created_at, attempt, *_ in rows
    ]


# What an event adds to a page or a stream beyond its data: its other fields, and the SSE frame's
# lines (`id:`, `event:` with a type of up to 64 characters).
EVENT_ENVELOPE_BYTES = 256


@dataclass(frozen=True)
class EventsRead:
    """Events after a cursor, at most so many rows and so many bytes."""

    # (seq, type, `event_json`), in seq order.
    rows: list[tuple[int, str, str]]
    # The byte bound stopped the read before the row bound or the stored events did: more follow.
    cut: bool
    # The run's (status, last_seq) in the same snapshot as the events, when read with them
    # (PostgreSQL, a page of at least one event).
    run_state: tuple[str, int] | None = None


# Sizes summed in the database over the range (N, N + limit] (the stored ones: no event's data is
# read for it), and only the events up to the cut read: a page of big events never brings those past
# its bound into this process. The first event is always in. Each row carries the run's status and
# last_seq, read in the statement's snapshot, so a page needs no statement of its own for them.
def _bounded_sql(scope: str, chosen: str) -> str:
    return f"""
WITH cut AS MATERIALIZED (
    SELECT COALESCE(MAX(seq) FILTER (WHERE upto <= %(bytes)s), MIN(seq)) AS last, MAX(seq) AS reached
    FROM (
        SELECT seq, SUM(COALESCE(data_bytes, octet_length(data::text)) + {EVENT_ENVELOPE_BYTES}) OVER (ORDER BY seq) AS upto
        FROM {scope}
    ) sized
)
SELECT {EVENT_COLUMNS},
    (SELECT status FROM {Run._meta.db_table} WHERE id = %(run)s),
    (SELECT last_seq FROM {Run._meta.db_table} WHERE id = %(run)s),
    (SELECT reached FROM cut)
FROM (
    SELECT seq, type, data::text AS data, data::text !~ %(not_plain)s AS plain, created_at, attempt
    FROM {RunEvent._meta.db_table} WHERE run_id = %(run)s AND seq > %(after)s AND seq <= (SELECT last FROM cut){chosen}
    OFFSET 0
) page
ORDER BY seq
"""


_EVENTS = RunEvent._meta.db_table
_EVENTS_JSON_BOUNDED_SQL = _bounded_sql(
    f"{_EVENTS} WHERE run_id = %(run)s AND seq > %(after)s AND seq <= %(upper)s", ""
)
# A page of chosen types (`?types=`) is not a range of seqs: the first `limit` events of those types
# after the cursor, however far apart (the run's (run, seq) index, read as far as they reach).
_CHOSEN = " AND (type = ANY(%(types)s) OR type LIKE ANY(%(prefixes)s))"
_EVENTS_CHOSEN_JSON_BOUNDED_SQL = _bounded_sql(
    f"(SELECT seq, data_bytes, data FROM {_EVENTS} WHERE run_id = %(run)s AND seq > %(after)s{_CHOSEN}"
    " ORDER BY seq LIMIT %(limit)s) chosen",
    _CHOSEN,
)


def run_events_json_bounded(
    *, run_id: UUID | str, after_seq: int, limit: int, max_bytes: int | None, types: TypeSelection | None = None
) -> EventsRead:
    """`run_events_json_after`, stopped before the event that would take the rows (with
    `EVENT_ENVELOPE_BYTES` each) past `max_bytes` (None: no byte bound); at least one event. With
    `types`, only the events of those types, the first `limit` of them after `after_seq`."""
    if types is not None and max_bytes is None:
        max_bytes = 2**62  # one statement for chosen types, bounded or not
    if max_bytes is None:
        return EventsRead(rows=run_events_json_after(run_id=run_id, after_seq=after_seq, limit=limit), cut=False)
    if connection.vendor == "postgresql":
        with prepared_cursor() as cursor:
            cursor.execute(*events_bounded_statement(run_id, after_seq, limit, max_bytes, types))
            return events_bounded_read(cursor.fetchall())
    if types is not None:
        return _chosen_rows(run_id, after_seq, limit, max_bytes, types)
    in_range = RunEvent.objects.filter(run_id=run_id, seq__gt=after_seq, seq__lte=after_seq + limit)
    sizes = in_range.order_by("seq").values_list("seq", Coalesce("data_bytes", Length("data")))
    last, total = None, 0
    for seq, size in sizes:
        total += size + EVENT_ENVELOPE_BYTES
        if last is not None and total > max_bytes:
            rows = run_events_json_after(run_id=run_id, after_seq=after_seq, limit=last - after_seq)
            return EventsRead(rows=rows, cut=True)
        last = seq
    return EventsRead(rows=run_events_json_after(run_id=run_id, after_seq=after_seq, limit=limit), cut=False)


def events_bounded_statement(
    run_id: UUID | str, after_seq: int, limit: int, max_bytes: int, types: TypeSelection | None = None
) -> tuple[str, dict[str, Any]]:
    """`run_events_json_bounded`'s statement on PostgreSQL, for a caller that sends it with others;
    `events_bounded_read` is the read its rows make."""
    params: dict[str, Any] = {"run": run_id, "after": after_seq, "upper": after_seq + limit, "bytes": max_bytes}
    params["not_plain"] = NOT_PLAIN
    if types is None:
        return _EVENTS_JSON_BOUNDED_SQL, params
    params["limit"], params["types"] = limit, sorted(types.exact)
    # LIKE's own wildcard `_` may be in a type; `\` is PostgreSQL's default escape.
    params["prefixes"] = [prefix.replace("_", "\\_") + "%" for prefix in types.prefixes]
    return _EVENTS_CHOSEN_JSON_BOUNDED_SQL, params


def events_bounded_read(fetched: list[Any]) -> EventsRead:
    if not fetched:
        return EventsRead(rows=[], cut=False)
    status, last_seq, reached = fetched[-1][-3:]
    return EventsRead(rows=json_rows(fetched), cut=fetched[-1][0] < reached, run_state=(status, last_seq))


def _chosen_rows(run_id: UUID | str, after_seq: int, limit: int, max_bytes: int, types: TypeSelection) -> EventsRead:
    """The events of `types` after `after_seq` off PostgreSQL (SQLite: the development database)."""
    chosen = Q(type__in=types.exact)
    for prefix in types.prefixes:
        chosen |= Q(type__startswith=prefix)
    rows: list[tuple[int, str, str]] = []
    total = 0
    for event in RunEvent.objects.filter(chosen, run_id=run_id, seq__gt=after_seq).order_by("seq")[:limit]:
        rows.append((event.seq, event.type, event_json(event)))
        total += len(rows[-1][2]) + EVENT_ENVELOPE_BYTES
        if len(rows) > 1 and total > max_bytes:
            return EventsRead(rows=rows[:-1], cut=True)
    return EventsRead(rows=rows, cut=False)


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
    # The events' JSON texts joined by "," (`event_json`, the bytes SSE sends too).
    items: str
    next_after_seq: int
    last_seq: int
    run_status: str
    end_of_stream: bool

    def json(self) -> str:
        """The page as its answer's body: the events, already JSON (the bytes SSE sends), spliced
        in rather than decoded and serialised again."""
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
