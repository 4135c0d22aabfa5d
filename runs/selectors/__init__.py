"""Every non-trivial read of runs and events, with the visibility rule (docs/design/api.md#access);
`__all__` is the public API for host code (docs/reference/python.md), the rest may change. Beside
it, a module per subject.

Modules (docs/hooks/reference.py --write keeps this index):

    clock.py        The database's clock, the one every process judges time-bound state by
    credentials.py  Which credentials hold: a request's API token
    event_text.py   A page of a run's events as the one text it is sent as
    overview.py     Reads about the whole system rather than one run
    published.py    What the edge's publisher reads after a wake-up
    results.py      What a run produced and used, for its JSON
    states.py       The state of runs by id, many in one query, for the processes that follow runs
                    rather than show them
    webhooks.py     Reads of webhook endpoints and deliveries
"""

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import connection
from django.db.models import (
    BooleanField,
    Case,
    Exists,
    ExpressionWrapper,
    F,
    FilteredRelation,
    Func,
    IntegerField,
    JSONField,
    OuterRef,
    Q,
    QuerySet,
    TextField,
    Value,
    When,
)
from django.db.models.functions import Cast, Coalesce, Left, Length

from runs.access import SEES_EVERY_RUN, AnyUser, sees_every_run
from runs.events import TypeSelection
from runs.exceptions import NotFound
from runs.models import Run, RunAttempt, RunEvent

__all__ = ["run_get", "run_list"]


def run_visible(*, user: AnyUser) -> QuerySet[Run]:
    """Runs the user may see: their own, or all with `runs.view_run` or `runs.change_run`."""
    if not user.is_authenticated:
        return Run.objects.none()
    if sees_every_run(user):
        return Run.objects.all()
    return Run.objects.filter(owner_id=user.pk)


def run_parentable(*, user: AnyUser) -> QuerySet[Run]:
    """Runs the user may create children under: their own, or all with `runs.change_run`."""
    if not user.is_authenticated:
        return Run.objects.none()
    if user.has_perm("runs.change_run"):
        return Run.objects.all()
    return Run.objects.filter(owner_id=user.pk)


def run_is_visible(run: Run, *, user: AnyUser) -> bool:
    """The rule of `run_visible` for one row already read: an owner needs no permission lookup."""
    return bool(user.is_authenticated) and (run.owner_id == user.pk or sees_every_run(user))


def users_active(*, user_ids: Collection[int]) -> dict[int, bool]:
    """The active users among `user_ids`, each with whether it sees every run: `sees_every_run`
    for many users in one query, by the rule of Django's ModelBackend (the only authentication
    backend configured) — an active superuser holds every permission, others hold one directly or
    through a group."""
    codenames = [perm.removeprefix("runs.") for perm in SEES_EVERY_RUN]
    perms = Permission.objects.filter(content_type__app_label="runs", codename__in=codenames)
    User = get_user_model()
    direct = User.user_permissions.through.objects.filter(user_id=OuterRef("pk"), permission__in=perms)
    grouped = User.groups.through.objects.filter(user_id=OuterRef("pk"), group__permissions__in=perms)
    rows = (
        User.objects.filter(pk__in=user_ids, is_active=True)
        .annotate(sees_every_run=Q(is_superuser=True) | Exists(direct) | Exists(grouped))
        .values_list("pk", "sees_every_run")
    )
    return {int(pk): bool(sees) for pk, sees in rows}


def run_get(*, run_id: UUID | str, user: AnyUser | None = None, only: tuple[str, ...] = ()) -> Run:
    """The run `run_id`, with its owner; with `user`, only one they may see (their own, or any with
    `runs.view_run` or `runs.change_run`), else `NotFound` as for no such run, never a 403. `only`
    (internal): just those fields, no owner, for a read that needs a few, such as a page of events."""
    if user is not None and not user.is_authenticated:
        raise NotFound(f"run {run_id} not found")
    runs = Run.objects.only("owner_id", *only) if only else Run.objects.select_related("owner")
    try:
        run = runs.get(pk=run_id)
    except (Run.DoesNotExist, ValueError, DjangoValidationError) as exc:
        raise NotFound(f"run {run_id} not found") from exc
    if user is not None and not run_is_visible(run, user=user):
        raise NotFound(f"run {run_id} not found")
    return run


def run_list(
    *,
    user: AnyUser,
    status: Collection[str] = (),
    end_code: Collection[str] = (),
    agent: str | None = None,
    parent: UUID | None = None,
    metadata: Mapping[str, str] | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
) -> QuerySet[Run]:
    """The runs `user` may see (as `run_get`) that match every filter given: `status` and `end_code`
    any of their values, `agent`, `parent` (its children), `metadata` (every label), `created_after`
    (inclusive), `created_before`; newest first, by the unique (-created_at, -id) a cursor needs
    (docs/design/api.md#paging). A lazy QuerySet; its big fields (`input`, `output`, …) load on access."""
    qs = run_visible(user=user).select_related("owner")
    filters: dict[str, Any] = {}
    if status:
        filters["status__in"] = sorted(set(status))
    if end_code:
        filters["end_code__in"] = sorted(set(end_code))
    if agent:
        filters["agent"] = agent
    if parent:
        filters["parent_id"] = parent
    if created_after:
        filters["created_at__gte"] = created_after
    if created_before:
        filters["created_at__lt"] = created_before
    qs = run_with_metadata(runs=qs.filter(**filters), metadata=metadata or {})
    # A list never needs a run's documents whole (each up to the body limit, a page of them tens of
    # MB): `run_list_values` reads back the small ones.
    return qs.order_by(*RUN_LIST_ORDER).defer(*_DOCUMENTS)


# The list's order; the last field unique, so that no two runs tie.
RUN_LIST_ORDER = ("-created_at", "-id")


def run_with_metadata(*, runs: QuerySet[Run], metadata: Mapping[str, str]) -> QuerySet[Run]:
    """`runs` whose metadata holds every key of `metadata` with its value. On PostgreSQL one
    containment, `metadata @> '{…}'`, which the GIN index `run_metadata` answers (migration
    0010); SQLite has no containment on JSON, so there each key is compared on its own."""
    if not metadata:
        return runs
    if connection.vendor == "postgresql":
        return runs.filter(metadata__contains=dict(metadata))
    return runs.filter(*(_HasLabel(F("metadata"), Value(key), Value(value)) for key, value in metadata.items()))


class _HasLabel(Func):
    """SQLite: the JSON object (the first expression) holds the key (the second) with the string
    value (the third). Its pairs are read with json_each, so a key is compared whole: no JSON path
    is written from it, whose quoting SQLite and Django spell differently."""

    output_field = BooleanField()

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> Any:  # type: ignore[override]
        (document, document_params), (key, key_params), (value, value_params) = (
            compiler.compile(expression) for expression in self.get_source_expressions()
        )
        sql = f"EXISTS (SELECT 1 FROM json_each({document}) WHERE key = {key} AND type = 'text' AND value = {value})"
        return sql, (*document_params, *key_params, *value_params)


# What a run holds that can be big: its JSON values, the reason it ended (up to 10,000 characters)
# and its open tool calls (as many as its events).
_VALUES = ("input", "output", "error")
_DOCUMENTS = (*_VALUES, "end_reason", "open_tool_calls")


class _OctetLength(Func):
    # Bytes, not characters: SQLite has no octet_length before 3.43.
    function = "octet_length"
    output_field = IntegerField()

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(compiler, connection, template="length(CAST(%(expressions)s AS BLOB))", **extra)


def run_list_values(*, runs: QuerySet[Run], max_bytes: int | None) -> QuerySet[Run]:
    """`runs` (deferred by `run_list`) with what a list item carries of each run's documents
    (docs/design/fair-use.md#bounded-answers): `listed_<name>` for input, output and error — the
    value when its JSON is at most `max_bytes`, else None — and `listed_end_reason`, whole up to
    `max_bytes` bytes, else its first `max_bytes // 4` characters (at most `max_bytes` in UTF-8);
    `<name>_cut` says which were left out or cut. The stored sizes decide (`Run.input_bytes`, …): a
    big value is never read from the database at all. `max_bytes` None: every value whole."""
    if max_bytes is None:
        whole: dict[str, Any] = {f"listed_{name}": F(name) for name in _VALUES}
        cut = {f"{name}_cut": Value(False) for name in (*_VALUES, "end_reason")}
        return runs.annotate(**whole, listed_end_reason=F("end_reason"), **cut)
    small = {
        f"listed_{name}": Case(
            When(**{f"{name}_bytes__lte": max_bytes}, then=F(name)), default=None, output_field=JSONField()
        )
        for name in _VALUES
    }
    big = {f"{name}_cut": Q(**{f"{name}_bytes__gt": max_bytes}) for name in _VALUES}
    return runs.alias(end_reason_bytes=_OctetLength("end_reason")).annotate(
        **small,
        **{name: ExpressionWrapper(condition, output_field=BooleanField()) for name, condition in big.items()},
        listed_end_reason=Case(
            When(Q(end_reason_bytes__lte=max_bytes), then=F("end_reason")),
            default=Left("end_reason", max(1, max_bytes // 4)),
            output_field=TextField(),
        ),
        end_reason_cut=ExpressionWrapper(Q(end_reason_bytes__gt=max_bytes), output_field=BooleanField()),
    )


def run_current_attempt(*, run: Run) -> RunAttempt | None:
    if run.generation == 0:
        return None
    return RunAttempt.objects.filter(run_id=run.pk, generation=run.generation).first()


def run_events_after(*, run_id: UUID | str, after_seq: int, limit: int) -> list[RunEvent]:
    """Stored events with seq > after_seq, in order — the only source of every stream and page."""
    return list(RunEvent.objects.filter(run_id=run_id, seq__gt=after_seq).order_by("seq")[:limit])


# The event object (docs/design/events.md#event-object) as compact JSON: the bytes of SSE `data:`
# and of a JSON page's items.
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def event_json(event: RunEvent) -> str:
    return _encode(event.as_dict())


# `data` as its JSON text and `created_at` as RunEvent.as_dict() writes it (less the "Z" and a zero
# fraction, which Python's isoformat leaves out): loading a timestamptz into a Python datetime cost
# about 10 µs a row here, three quarters of a replay's time.
# Seqs are gap-free, so the page after N is the range (N, N + limit]: bounded, it reads `limit` rows
# whatever plan PostgreSQL picks. Unbounded, a planner expecting a run to hold a few events (stale
# statistics, or the average run) picked a bitmap scan and sort of every later event of the run, for
# each page: a catch-up of 100k events went quadratic (33 ms for the first page instead of 0.3 ms).
#
# `data` compact when PostgreSQL can make it so exactly, with a flag saying it did. Decoding each
# event's data and encoding it again took most of a replay's time in the web process (about 4 µs
# an event here, against under 1 µs for this in PostgreSQL, on its own core). jsonb prints a space
# after each `,` and `:` between values; dropping them is exact unless a string holds ", " or ": "
# itself, or a number has a fraction — PostgreSQL prints the stored digits in plain notation
# (0.00001) where Python's encoder writes what `json.loads` makes of them (1e-05). The regular
# expression finds either, reading strings as whole tokens; such an event's data goes through
# Python as before (tests/test_event_text.py compares the two on any JSON).
_STRING = r'"(?:[^"\\]|\\.)*"'
_NOT_PLAIN = rf'^(?:[^".]|{_STRING})*(?:\.|"(?:[^"\\]|\\.)*(?:, |: ))'
_EVENT_COLUMNS = """seq, type, CASE WHEN plain THEN replace(replace(data, ', ', ','), ': ', ':') ELSE data END, plain,
    to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'), attempt"""
# OFFSET 0 keeps the inner query whole, so each row's data is printed once, not once per use.
_EVENTS_JSON_SQL = (
    f"SELECT {_EVENT_COLUMNS} FROM (SELECT seq, type, data::text AS data, data::text !~ %s AS plain, created_at,"
    f" attempt FROM {RunEvent._meta.db_table} WHERE run_id = %s AND seq > %s AND seq <= %s ORDER BY seq LIMIT %s"
    " OFFSET 0) page ORDER BY seq"
)


def run_events_json_after(*, run_id: UUID | str, after_seq: int, limit: int) -> list[tuple[int, str, str]]:
    """`run_events_after` as (seq, type, `event_json`) rows: the hot path of streams and pages,
    which only send the events on. The same bytes as `event_json(event)` on every backend."""
    if connection.vendor != "postgresql":
        return [
            (e.seq, e.type, event_json(e)) for e in run_events_after(run_id=run_id, after_seq=after_seq, limit=limit)
        ]
    with connection.cursor() as cursor:
        cursor.execute(_EVENTS_JSON_SQL, [_NOT_PLAIN, run_id, after_seq, after_seq + limit, limit])
        return _json_rows(cursor.fetchall())


def _json_rows(rows: Iterable[Sequence[Any]]) -> list[tuple[int, str, str]]:
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


# Sizes summed in the database over the range (N, N + limit] — the stored ones, so no event's data
# is read for it (only an event stored before sizes were kept is measured) — and only the events up
# to the cut read and sent: a page of big events never brings those past its bound into this
# process. The first event is always in, however big. `cut` is a CTE read twice, so computed once.
# Each row also carries the run's status and last_seq, read in the statement's snapshot, so with
# its events: an events page needs no statement of its own for them.
def _bounded_sql(scope: str, chosen: str) -> str:
    return f"""
WITH cut AS MATERIALIZED (
    SELECT COALESCE(MAX(seq) FILTER (WHERE upto <= %(bytes)s), MIN(seq)) AS last, MAX(seq) AS reached
    FROM (
        SELECT seq, SUM(COALESCE(data_bytes, octet_length(data::text)) + {EVENT_ENVELOPE_BYTES}) OVER (ORDER BY seq) AS upto
        FROM {scope}
    ) sized
)
SELECT {_EVENT_COLUMNS},
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
        params: dict[str, Any] = {"run": run_id, "after": after_seq, "upper": after_seq + limit, "bytes": max_bytes}
        params["not_plain"] = _NOT_PLAIN
        sql = _EVENTS_JSON_BOUNDED_SQL
        if types is not None:
            sql = _EVENTS_CHOSEN_JSON_BOUNDED_SQL
            params["limit"], params["types"] = limit, sorted(types.exact)
            # LIKE's own wildcard `_` may be in a type; `\` is PostgreSQL's default escape.
            params["prefixes"] = [prefix.replace("_", "\\_") + "%" for prefix in types.prefixes]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            fetched = cursor.fetchall()
        if not fetched:
            return EventsRead(rows=[], cut=False)
        status, last_seq, reached = fetched[-1][-3:]
        return EventsRead(rows=_json_rows(fetched), cut=fetched[-1][0] < reached, run_state=(status, last_seq))
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


def run_event_sizes(*, run_id: UUID | str, after_seq: int, limit: int) -> list[tuple[int, int]]:
    """(seq, bytes of its type and of its data's JSON text) of the events with seq > after_seq, in
    order, at most `limit`: what a replay weighs, read before the events themselves."""
    sizes = _OctetLength("type") + _OctetLength(Cast("data", TextField()))
    events = RunEvent.objects.filter(run_id=run_id, seq__gt=after_seq).order_by("seq")
    return list(events.values_list("seq", sizes)[:limit])


def run_events_all(*, run_id: UUID | str) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run_id=run_id).order_by("seq"))


def run_descendants(*, run_id: UUID | str) -> list[Run]:
    found: list[Run] = []
    frontier = [run_id]
    while frontier:
        children = list(Run.objects.filter(parent_id__in=frontier).order_by("created_at", "id"))
        found.extend(children)
        frontier = [c.pk for c in children]
    return found


# --- staff console (admin) ------------------------------------------------------------------


def run_admin_list() -> QuerySet[Run]:
    """Runs with what the staff list shows, in one query: the owner and the current attempt joined
    (never a query per row). (run, generation) is unique, so the join adds no rows; a join rather
    than a correlated subquery, because deep pages make PostgreSQL compute the skipped rows too."""
    return (
        Run.objects.select_related("owner")
        .annotate(current_attempt=FilteredRelation("attempts", condition=Q(attempts__generation=F("generation"))))
        .annotate(current_heartbeat_at=F("current_attempt__heartbeat_at"))
    )


def run_events_seq_range(*, run_id: UUID | str, first_seq: int, last_seq: int) -> list[RunEvent]:
    """Events with first_seq <= seq <= last_seq. Seqs are gap-free, so a page of the timeline is a
    range on the (run, seq) index — no OFFSET, no COUNT, however many events the run has."""
    return list(RunEvent.objects.filter(run_id=run_id, seq__gte=first_seq, seq__lte=last_seq).order_by("seq"))


def run_children_page(*, run_id: UUID, limit: int) -> tuple[int, list[Run]]:
    """How many direct children a run has, and the first `limit` of them (oldest first)."""
    children = Run.objects.filter(parent_id=run_id)
    return children.count(), list(children.order_by("created_at", "id")[:limit])
