"""Every non-trivial read of runs and events, with the visibility rule (docs/design/api.md#access);
`__all__` is the public API for host code (docs/reference/python.md), the rest may change. Beside
it, a module per subject: `wire` the events as they are sent (docs/design/streaming.md#wire),
`run_json` the run as JSON, `overview` the whole system's figures, `states` runs' state by id,
`published` the edge publisher's read, `results`, `credentials`, `webhooks`, `clock`, and `compiled`
the hot reads' statements kept.
"""

# Modules (docs/hooks/reference.py --write keeps this index):
#
#     clock.py        The database's clock, the one every process judges time-bound state by
#     compiled.py     Hot reads compiled once per process
#     credentials.py  Which credentials hold: a request's API token
#     overview.py     Reads about the whole system rather than one run
#     published.py    What the edge's publisher reads after a wake-up
#     results.py      What a run produced and used, for its JSON
#     run_json.py     The run's JSON: the one representation of a run that the API answers
#     schedules.py    Reads of schedules: one's own, by id or paged, and the late ones
#     states.py       The state of runs by id, many in one query, for the processes that follow runs
#                     rather than show them
#     webhooks.py     Reads of webhook endpoints and deliveries
#     wire.py         The event wire format's one home

from collections.abc import Collection, Mapping, Sequence
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
from django.db.models.functions import Cast, Left

from runs.access import SEES_EVERY_RUN, AnyUser, can_see, sees_every_run
from runs.exceptions import NotFound
from runs.models import Run, RunEvent
from runs.prepared import SEPARATOR, pipelining, send_pipelined
from runs.selectors.compiled import CompiledRead, Param, as_get
from runs.selectors.results import JOINED_PARTIAL_OUTPUT, partial_output_column, partial_output_rules
from runs.selectors.run_json import JOINED_ATTEMPT
from runs.selectors.wire import EventsRead, events_bounded_read, events_bounded_statement

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


def _run(only: tuple[str, ...], joined: bool, rules: str | None, *, pk: UUID) -> QuerySet[Run]:
    runs = Run.objects.only("owner_id", *only) if only else Run.objects.select_related("owner")
    if joined:
        # (run, generation) is unique: the join adds no row (as `run_admin_list`).
        attempt = FilteredRelation("attempts", condition=Q(attempts__generation=F("generation")))
        runs = runs.annotate(**{JOINED_ATTEMPT: attempt}).select_related(JOINED_ATTEMPT)
    if rules is not None:
        runs = runs.annotate(**{JOINED_PARTIAL_OUTPUT: partial_output_column(rules)})
    return as_get(runs.filter(pk=pk))


_RUN = CompiledRead(Run, _run, pk=Param(Run._meta.get_field("id"), (UUID(int=1), UUID(int=2))))


def run_get(
    *, run_id: UUID | str, user: AnyUser | None = None, only: tuple[str, ...] = (), for_json: bool = False
) -> Run:
    """The run `run_id`, with its owner; with `user`, only one they may see (their own, or any with
    `runs.view_run` or `runs.change_run`), else `NotFound` as for no such run, never a 403. `only`
    (internal): just those fields, no owner, for a read that needs a few, such as a page of events.
    `for_json` (internal): with what its JSON reads besides the row (docs/design/api.md#hot-reads) — its current
    attempt joined, and on PostgreSQL its partial output — so that the answer is this one statement.
    Compiled once per process (runs.selectors.compiled)."""
    if user is not None and not user.is_authenticated:
        raise NotFound(f"run {run_id} not found")
    try:
        found = _RUN.objects(only, for_json, partial_output_rules() if for_json else None, pk=run_id)
    except (ValueError, DjangoValidationError) as exc:
        raise NotFound(f"run {run_id} not found") from exc
    run = _visible(found, user, run_id)
    if for_json and not hasattr(run, JOINED_ATTEMPT):
        setattr(run, JOINED_ATTEMPT, None)  # none joined: the ORM sets no attribute then
    return run


def _visible(found: list[Run], user: AnyUser | None, run_id: UUID | str) -> Run:
    if not found or (user is not None and not can_see(user, found[0])):
        raise NotFound(f"run {run_id} not found")
    return found[0]


def run_get_with_events(
    *, run_id: UUID | str, user: AnyUser, after_seq: int, limit: int, max_bytes: int | None
) -> tuple[Run, EventsRead | None]:
    """`run_get` for `user` and, in its round trip, the events after `after_seq` as
    `run_events_json_bounded` reads them: read before the run is known to be `user`'s, and never
    returned unless it is (a stream's opening, docs/design/streaming.md#opening). None for the
    events where statements are not pipelined: the caller reads them itself if it still wants them."""
    if not pipelining() or not user.is_authenticated or max_bytes is None:
        return run_get(run_id=run_id, user=user), None
    try:
        pk = run_id if isinstance(run_id, UUID) else UUID(run_id)
    except ValueError as exc:
        raise NotFound(f"run {run_id} not found") from exc
    statements: list[tuple[str, Sequence[Any] | Mapping[str, Any]]] = [
        _RUN.statement((), False, None, pk=pk),
        events_bounded_statement(pk, after_seq, limit, max_bytes),
    ]
    run_rows, event_rows = send_pipelined(statements, separator=SEPARATOR)
    return _visible(_RUN.from_rows(run_rows, (), False, None), user, run_id), events_bounded_read(event_rows)


def run_list(
    *,
    user: AnyUser,
    status: Collection[str] = (),
    end_code: Collection[str] = (),
    agent: str | None = None,
    parent: UUID | None = None,
    schedule: UUID | None = None,
    metadata: Mapping[str, str] | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
) -> QuerySet[Run]:
    """The runs `user` may see (as `run_get`) that match every filter given: `status` and `end_code`
    any of their values, `agent`, `parent` (its children), `schedule` (the runs it created; through
    `run_one_per_due_time`), `metadata` (every label), `created_after`
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
    if schedule:
        filters["schedule_id"] = schedule
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
