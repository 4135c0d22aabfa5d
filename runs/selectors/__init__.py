"""Every non-trivial read of runs and events, with the visibility rule of DESIGN §6; the whole
system's figures (the staff dashboard, the /metrics/ state gauges) are `overview`'s."""

import json
from collections.abc import Collection
from datetime import datetime
from typing import Any
from uuid import UUID

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import connection
from django.db.models import Exists, F, FilteredRelation, OuterRef, Q, QuerySet

from runs.access import SEES_EVERY_RUN, AnyUser, sees_every_run
from runs.exceptions import NotFound
from runs.models import Run, RunAttempt, RunEvent


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


def run_get(*, run_id: UUID | str, user: AnyUser | None = None) -> Run:
    """A run by id; with a user, only if visible to them (else NotFound, never a 403).

    The rule of `run_visible`, checked on the row: an owner needs no permission lookup (two
    queries on every request of the API and of every stream opened)."""
    if user is not None and not user.is_authenticated:
        raise NotFound(f"run {run_id} not found")
    try:
        run = Run.objects.select_related("owner").get(pk=run_id)
    except (Run.DoesNotExist, ValueError, DjangoValidationError) as exc:
        raise NotFound(f"run {run_id} not found") from exc
    if user is not None and not run_is_visible(run, user=user):
        raise NotFound(f"run {run_id} not found")
    return run


def run_list(
    *,
    user: AnyUser,
    status: str | None = None,
    agent: str | None = None,
    parent: UUID | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
) -> QuerySet[Run]:
    qs = run_visible(user=user).select_related("owner")
    filters: dict[str, Any] = {}
    if status:
        filters["status"] = status
    if agent:
        filters["agent"] = agent
    if parent:
        filters["parent_id"] = parent
    if created_after:
        filters["created_at__gte"] = created_after
    if created_before:
        filters["created_at__lt"] = created_before
    return qs.filter(**filters).order_by("-created_at", "id")


def run_current_attempt(*, run: Run) -> RunAttempt | None:
    if run.generation == 0:
        return None
    return RunAttempt.objects.filter(run_id=run.pk, generation=run.generation).first()


def run_events_after(*, run_id: UUID | str, after_seq: int, limit: int) -> list[RunEvent]:
    """Stored events with seq > after_seq, in order — the only source of every stream and page."""
    return list(RunEvent.objects.filter(run_id=run_id, seq__gt=after_seq).order_by("seq")[:limit])


# The event object of DESIGN §2 as compact JSON: the bytes of SSE `data:` and of a JSON page's items.
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
_EVENTS_JSON_SQL = (
    "SELECT seq, type, data::text, to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US'), attempt"
    f" FROM {RunEvent._meta.db_table} WHERE run_id = %s AND seq > %s AND seq <= %s ORDER BY seq LIMIT %s"
)


def run_events_json_after(*, run_id: UUID | str, after_seq: int, limit: int) -> list[tuple[int, str, str]]:
    """`run_events_after` as (seq, type, `event_json`) rows: the hot path of streams and pages,
    which only send the events on. The same bytes as `event_json(event)` on every backend."""
    if connection.vendor != "postgresql":
        return [
            (e.seq, e.type, event_json(e)) for e in run_events_after(run_id=run_id, after_seq=after_seq, limit=limit)
        ]
    with connection.cursor() as cursor:
        cursor.execute(_EVENTS_JSON_SQL, [run_id, after_seq, after_seq + limit, limit])
        rows = cursor.fetchall()
    # The object of `event_json` written out field by field (its bytes exactly: the same keys in
    # the same order, compact): only `data` goes through the JSON codec, re-encoded compactly.
    return [
        (
            seq,
            type_,
            f'{{"seq":{seq},"type":{_encode(type_)},"data":{_encode(json.loads(data))},'
            f'"created_at":"{created_at.removesuffix(".000000")}Z","attempt":{"null" if attempt is None else attempt}}}',
        )
        for seq, type_, data, created_at, attempt in rows
    ]


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
