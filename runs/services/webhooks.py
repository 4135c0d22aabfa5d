"""The webhook outbox (docs/design/webhooks.md#outbox): a notification written in the transaction of
the event it reports (`enqueue`, under the run's row lock), its deliveries claimed by the workers
under a lease so each POST runs outside any transaction, and the outcome of each attempt, written
only by the claim still current."""

import json
import operator
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import reduce
from typing import TypeVar
from uuid import UUID

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.db.models import F, Min, Model, Q, QuerySet
from django.utils import timezone

from runs import notify
from runs.access import sees_every_run
from runs.conf import conf
from runs.models import (
    DeliveryStatus,
    Run,
    Schedule,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookNotification,
)
from runs.selectors.run_json import run_json
from runs.services.statements import Statement, columns, from_row, insert, send_together

M = TypeVar("M", bound=Model)


def matches(endpoint: WebhookEndpoint, about: Run | Schedule, event_type: str) -> bool:
    """Whether `endpoint` wants `event_type` of `about`, a run or a schedule: by type and labels."""
    return event_type in endpoint.events and all(about.metadata.get(k) == v for k, v in endpoint.metadata.items())


def enqueue(run: Run, event_type: str, *, now: datetime) -> int:
    """Write a notification of the run's last event to each enabled endpoint that wants it; the
    caller holds the run's lock. Its body is made and stored once, whatever the number of endpoints
    (each delivery row points at it); the caller counts the bytes returned on the run, as it counts
    an event's (0: nothing written). With no endpoint: one indexed read. (The commands send these
    statements with their own: `runs.services.core`.)"""
    (endpoints,) = send_together(endpoints_read(run))
    writes, size = outbox(run, event_type, endpoints=endpoints, now=now)
    if writes:
        send_together(*writes)
        notify.send(notify.webhooks_due())
    return size


def endpoints_read(run: Run) -> Statement:
    """The enabled endpoints of the run's owner and those sent every owner's runs, key-shared
    (`key_shared`): a delivery is written only for an endpoint that cannot be deleted meanwhile.
    One index read of each kind (`webhook_enabled_owner`, `webhook_enabled_all`)."""
    return endpoints_of(run.owner_id)


def endpoints_of(owner_id: int) -> Statement:
    """`endpoints_read` for what an owner's schedule tells (docs/design/schedules.md#webhooks)."""
    table = WebhookEndpoint._meta.db_table
    sql = f"SELECT {columns(WebhookEndpoint)} FROM {table} WHERE enabled AND (owner_id = %s OR all_runs)"
    return sql + _KEY_SHARE[connection.vendor == "postgresql"], [owner_id]


_KEY_SHARE = {True: " FOR KEY SHARE", False: ""}


def outbox(
    run: Run, event_type: str, *, endpoints: Sequence[tuple[object, ...]], now: datetime
) -> tuple[list[Statement], int]:
    """The writes of the notification of the run's last event to those of `endpoints` (rows of
    `endpoints_read`) that want it, and its body's size (nothing, 0: none wants it). The caller
    sends them, with the `webhooks_due` note."""
    wanted = [e.id for e in (from_row(WebhookEndpoint, row) for row in endpoints) if matches(e, run, event_type)]
    if not wanted:
        return [], 0
    return notification_writes(
        (run.id, run.last_seq), event_type, data={"run": run_json(run)}, endpoint_ids=wanted, now=now
    )


def notification_writes(
    key: tuple[UUID, int], event_type: str, *, data: dict[str, object], endpoint_ids: Sequence[UUID], now: datetime
) -> tuple[list[Statement], int]:
    """The writes of one notification, `data` its body's, for each of `endpoint_ids`, keyed by
    `key` (a run's id and its event's seq; a schedule's id and its due time's: runs.services.schedule_notices);
    and its body's size."""
    # ASCII (json.dumps escapes the rest): its length is its size in bytes.
    body = json.dumps(
        {"type": event_type, "timestamp": now.isoformat().replace("+00:00", "Z"), "data": data},
        cls=DjangoJSONEncoder,
        separators=(",", ":"),
    )
    event = {"run_id": key[0], "seq": key[1], "event_type": event_type, "created_at": now}
    # Due at once; given up a day (RUNLEDGER_WEBHOOKS_GIVE_UP_SECONDS) after the event.
    timing = {"next_attempt_at": now, "give_up_at": now + timedelta(seconds=conf.WEBHOOKS_GIVE_UP_SECONDS)}
    deliveries = [WebhookDelivery(endpoint_id=endpoint_id, **event, **timing) for endpoint_id in endpoint_ids]
    # Its id is the database's: each delivery finds it by the event it reports, in the same send.
    notification_id = (
        f"(SELECT id FROM {WebhookNotification._meta.db_table} WHERE run_id = %s AND seq = %s)",
        [deliveries[0]._meta.get_field("run_id").get_db_prep_save(key[0], connection), key[1]],
    )
    writes = [
        insert([WebhookNotification(body=body, **event)]),
        insert(deliveries, computed={"notification": notification_id}),
    ]
    return writes, len(body)


def key_shared(rows: "QuerySet[M]") -> "Iterable[M]":
    """The rows, locked FOR KEY SHARE on PostgreSQL until the transaction ends: none of them is
    deleted meanwhile, while other transactions still read, lock and update them. An endpoint's
    delete (`webhook_delete`) locks it FOR UPDATE first, so it waits for the writes that point at
    it, or they find it gone. Django's select_for_update has no lock this weak; SQLite writes one
    transaction at a time."""
    if connection.vendor != "postgresql":
        return rows
    sql, params = rows.query.sql_with_params()
    return rows.model._default_manager.raw(f"{sql} FOR KEY SHARE", params)


@dataclass(frozen=True)
class Claimed:
    id: UUID
    endpoint_id: UUID
    owner_id: int
    webhook_id: str
    number: int
    url: str
    body: str
    secrets: tuple[str, ...]


@dataclass(frozen=True)
class Outcome:
    started_at: datetime
    duration_ms: int
    status_code: int | None = None
    response_head: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def lease_seconds() -> float:
    """How long a claim keeps a delivery from other workers: past the request's own timeout."""
    return 2 * conf.WEBHOOKS_TIMEOUT_SECONDS + 1


def deliveries_claim(*, limit: int, busy: Mapping[int, int] | None = None) -> tuple[list[Claimed], float | None]:
    """Claim up to `limit` due deliveries, fairly (`_fair_order`: `busy` says how many of each
    owner's this worker has in flight); with them, the seconds until the next one comes due (None:
    as many as asked were claimed, or none is pending)."""
    now = timezone.now()
    with transaction.atomic():
        order = _fair_order(now=now, limit=limit, busy=busy or {})
        due = WebhookDelivery.objects.filter(
            id__in=order, status=DeliveryStatus.PENDING, next_attempt_at__lte=now, endpoint__enabled=True
        ).select_related("endpoint__owner")
        if connection.vendor == "postgresql":
            # SKIP LOCKED: workers claiming at once take different rows instead of queueing on the
            # same ones. (SQLite's IMMEDIATE transactions serialise the claims instead.)
            due = due.select_for_update(skip_locked=True, of=("self",))
        found = {row.id: row for row in due} if order else {}
        rows = _still_allowed([found[pk] for pk in order if pk in found][:limit], now=now)
        if rows:
            WebhookDelivery.objects.filter(id__in=[row.id for row in rows]).update(
                next_attempt_at=now + timedelta(seconds=lease_seconds()), attempts=F("attempts") + 1
            )
        # Each body read once, however many of the batch's deliveries share it.
        bodies = dict(
            WebhookNotification.objects.filter(id__in={row.notification_id for row in rows}).values_list("id", "body")
        )
    claimed = [
        Claimed(
            id=row.id,
            endpoint_id=row.endpoint_id,
            owner_id=row.endpoint.owner_id,
            webhook_id=row.webhook_id,
            number=row.attempts + 1,
            url=row.endpoint.url,
            body=bodies[row.notification_id],
            secrets=_signing_secrets(row.endpoint, now),
        )
        for row in rows
    ]
    return claimed, None if len(rows) == limit else _next_due_in(now)


# The due deliveries in turns: each endpoint's in the order they fell due, interleaved so that an
# owner's turns go round their endpoints; each owner's numbered 1, 2, … (`per_owner`). Only the
# first `limit` of an owner can be claimed at once, so no more are read.
_FAIR_SQL = f"""
WITH due AS (
    SELECT d.id, e.owner_id, d.next_attempt_at,
           ROW_NUMBER() OVER (PARTITION BY d.endpoint_id ORDER BY d.next_attempt_at, d.id) AS per_endpoint
    FROM {WebhookDelivery._meta.db_table} d JOIN {WebhookEndpoint._meta.db_table} e ON e.id = d.endpoint_id
    WHERE d.status = %s AND d.next_attempt_at <= %s AND e.enabled
), ranked AS (
    SELECT id, owner_id, next_attempt_at,
           ROW_NUMBER() OVER (PARTITION BY owner_id ORDER BY per_endpoint, next_attempt_at, id) AS per_owner
    FROM due
)
SELECT id, owner_id, per_owner, next_attempt_at FROM ranked WHERE per_owner <= %s
"""


def _fair_order(*, now: datetime, limit: int, busy: Mapping[int, int]) -> list[UUID]:
    """The ids of at most twice `limit` due deliveries, in the order a claim takes them: an owner's
    n-th turn counts from the deliveries of theirs this worker already has in flight, and turns go
    first, the earliest due among equal turns. So an owner with nothing in flight is served at the
    next free slot, whatever another owner's endpoints hold (docs/design/webhooks.md#delivery).
    Twice: the rows another worker locked meanwhile are skipped, and the next ones taken."""
    with connection.cursor() as cursor:
        cursor.execute(_FAIR_SQL, [DeliveryStatus.PENDING.value, connection.ops.adapt_datetimefield_value(now), limit])
        rows = cursor.fetchall()
    rows.sort(key=lambda row: (busy.get(row[1], 0) + row[2], str(row[3]), str(row[0])))
    return [pk if isinstance(pk, UUID) else UUID(str(pk)) for pk, *_ in rows[: 2 * limit]]


def _still_allowed(rows: list[WebhookDelivery], *, now: datetime) -> list[WebhookDelivery]:
    """The rows whose endpoint may still be sent them. An endpoint sent every owner's runs whose
    owner no longer sees every run is disabled, with the reason; its deliveries wait."""
    revoked = {row.endpoint_id for row in rows if row.endpoint.all_runs and not sees_every_run(row.endpoint.owner)}
    if revoked:
        reason = "its owner no longer sees every run (runs.view_run), which all_runs needs"
        WebhookEndpoint.objects.filter(id__in=revoked).update(enabled=False, disabled_reason=reason, updated_at=now)
    return [row for row in rows if row.endpoint_id not in revoked]


def _signing_secrets(endpoint: WebhookEndpoint, now: datetime) -> tuple[str, ...]:
    expires = endpoint.previous_secret_expires_at
    if endpoint.previous_secret and expires is not None and expires > now:
        return (endpoint.secret, endpoint.previous_secret)
    return (endpoint.secret,)


def _next_due_in(now: datetime) -> float | None:
    pending = WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING, endpoint__enabled=True)
    first = pending.aggregate(first=Min("next_attempt_at"))["first"]
    return None if first is None else max(0.0, (first - now).total_seconds())


def retry_delay(number: int) -> float:
    """The wait after failed attempt `number` (1, 2, …): doubling from the base, jittered so
    that the retries of many deliveries that failed together spread out, never past the maximum."""
    base = conf.WEBHOOKS_RETRY_BASE_SECONDS * 2 ** min(number - 1, 30)
    # Jittered first, capped after: no wait is longer than RUNLEDGER_WEBHOOKS_RETRY_MAX_SECONDS.
    return min(conf.WEBHOOKS_RETRY_MAX_SECONDS, base * random.uniform(0.5, 1.5))


def deliveries_record(*, outcomes: Sequence[tuple[Claimed, Outcome]], worker: str) -> None:
    """Log each attempt and settle its delivery: delivered, due again after a backoff, or failed
    once past its give-up time; a batch's outcomes in one transaction, one commit for all. A claim
    that is no longer current (its lease lapsed and another worker claimed the row) logs its
    attempt and changes nothing else."""
    now = timezone.now()
    with transaction.atomic():
        # A delivery deleted with its endpoint meanwhile has nothing left to log or settle; an
        # endpoint deleted now waits for this commit, and deletes the attempts logged here.
        endpoints = {
            e.id
            for e in key_shared(WebhookEndpoint.objects.filter(id__in={c.endpoint_id for c, _ in outcomes}).only("id"))
        }
        kept = set(
            WebhookDelivery.objects.filter(id__in=[c.id for c, _ in outcomes], endpoint_id__in=endpoints).values_list(
                "id", flat=True
            )
        )
        outcomes = [(claimed, outcome) for claimed, outcome in outcomes if claimed.id in kept]
        WebhookAttempt.objects.bulk_create(
            WebhookAttempt(
                delivery_id=claimed.id,
                number=claimed.number,
                started_at=outcome.started_at,
                duration_ms=outcome.duration_ms,
                status_code=outcome.status_code,
                response_head=outcome.response_head,
                error=outcome.error,
                worker=worker,
            )
            for claimed, outcome in outcomes
        )
        # Endpoints in one order in every worker's batch: two batches touching the same endpoints'
        # rows wait for each other instead of deadlocking.
        ordered = sorted(outcomes, key=lambda pair: str(pair[0].endpoint_id))
        for claimed, outcome in ordered:
            if not outcome.ok:
                _settle_failed(claimed, outcome, now=now)
        delivered = [claimed for claimed, outcome in ordered if outcome.ok]
        if delivered:
            _settle_delivered(delivered, now=now)


def delivery_record(*, claimed: Claimed, outcome: Outcome, worker: str) -> None:
    deliveries_record(outcomes=[(claimed, outcome)], worker=worker)


def _current(claimed: Sequence[Claimed]) -> Q:
    # The claims still current: their number is the row's count of claims.
    return reduce(operator.or_, (Q(id=c.id, attempts=c.number) for c in claimed)) & Q(status=DeliveryStatus.PENDING)


def _settle_delivered(claimed: Sequence[Claimed], *, now: datetime) -> None:
    WebhookDelivery.objects.filter(_current(claimed)).update(
        status=DeliveryStatus.DELIVERED, delivered_at=now, last_error=""
    )
    # Written only when it was failing: the common success leaves the endpoint's row alone.
    for endpoint_id in sorted({c.endpoint_id for c in claimed}, key=str):
        WebhookEndpoint.objects.filter(id=endpoint_id, failing_since__isnull=False).update(failing_since=None)


def _settle_failed(claimed: Claimed, outcome: Outcome, *, now: datetime) -> None:
    current = WebhookDelivery.objects.select_for_update(no_key=True).filter(_current([claimed]))
    delivery = current.first()
    if delivery is None:
        return
    said = outcome.error or f"HTTP {outcome.status_code}"
    if now >= delivery.give_up_at:
        current.update(status=DeliveryStatus.FAILED, last_error=said)
    else:
        current.update(next_attempt_at=now + timedelta(seconds=retry_delay(claimed.number)), last_error=said)
    endpoint = WebhookEndpoint.objects.filter(id=delivery.endpoint_id)
    endpoint.filter(failing_since__isnull=True).update(failing_since=now)
    since = now - timedelta(seconds=conf.WEBHOOKS_DISABLE_AFTER_SECONDS)
    reason = "every delivery failed since {since}; the last: {said}"
    failing = endpoint.filter(enabled=True, failing_since__lte=since)
    for row in failing.only("failing_since"):
        assert row.failing_since is not None
        failing.update(enabled=False, disabled_reason=reason.format(since=row.failing_since.isoformat(), said=said))


def deliveries_redeliver(*, ids: list[UUID]) -> int:
    """Make these deliveries due now, with a new give-up time: an admin's redeliver. The same
    `webhook-id`: a receiver that had it already may drop it."""
    now = timezone.now()
    with transaction.atomic():
        count = WebhookDelivery.objects.filter(id__in=ids).update(
            status=DeliveryStatus.PENDING,
            next_attempt_at=now,
            give_up_at=now + timedelta(seconds=conf.WEBHOOKS_GIVE_UP_SECONDS),
        )
        if count:
            notify.send(notify.webhooks_due())
    return count
