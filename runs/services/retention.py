"""Retention: deleting old terminal runs with their events and attempts, the webhook deliveries of
purged runs once they are over, idempotency records past their TTL, and failed sign-ins and token
attempts past their window (`manage.py purge_runs`, docs/design/webhooks.md#outbox)."""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from runs.conf import conf
from runs.exceptions import ValidationFailed
from runs.http.throttles import auth_failures_purge
from runs.models import (
    DeliveryStatus,
    IdempotencyRecord,
    Run,
    RunAttempt,
    RunEvent,
    WebhookDelivery,
    WebhookNotification,
)
from runs.transitions import TERMINAL

# Rows one transaction deletes at most: a run with a long history goes in several.
EVENTS_PER_TRANSACTION = 10_000


@dataclass(frozen=True)
class PurgeResult:
    runs: int
    events: int
    attempts: int
    batches: int
    # Idempotency records deleted: every one past RUNLEDGER_IDEMPOTENCY_TTL_SECONDS (it can no longer
    # be replayed, and it holds the whole request body).
    idempotency_records: int = 0
    # Failed sign-ins and token attempts older than RUNLEDGER_AUTH_FAILURE_WINDOW_SECONDS: they no
    # longer count (each failure deletes a few as it goes; this takes whatever is left).
    auth_failures: int = 0
    # Webhook deliveries of purged runs that are over: given up, or delivered more than
    # RUNLEDGER_WEBHOOKS_KEEP_DAYS ago (pending ones stay until they end).
    webhook_deliveries: int = 0


def _purge_blocked(*, ended_before: datetime) -> set[UUID]:
    """Qualifying runs that must stay because a descendant does not qualify.

    Deleting a run deletes its whole subtree (the parent foreign key cascades), so a run goes only
    when every descendant qualifies too. A terminal parent's descendants normally ended with it or
    before, so this is empty unless clocks disagreed between machines; it is checked anyway.
    """
    qualifying = Run.objects.filter(status__in=TERMINAL, ended_at__lt=ended_before)
    blocked: set[UUID] = set()
    frontier = set(
        Run.objects.filter(parent__in=qualifying).exclude(pk__in=qualifying).values_list("parent_id", flat=True)
    )
    while frontier:
        blocked |= frontier
        parents = Run.objects.filter(pk__in=frontier, parent_id__isnull=False).values_list("parent_id", flat=True)
        frontier = set(parents) - blocked
    return blocked


def runs_purge(
    *,
    ended_before: datetime,
    batch_size: int = 500,
    dry_run: bool = False,
    events_per_transaction: int = EVENTS_PER_TRANSACTION,
) -> PurgeResult:
    """Delete terminal runs that ended before `ended_before`, with their events and attempts.

    Live runs (queued, running, waiting) are never touched: only terminal rows qualify, and a
    terminal state is absorbing, so a run selected here cannot come back to life before it goes.
    Each batch is its own transaction, so a large purge never holds one long lock.
    """
    if batch_size < 1 or events_per_transaction < 1:
        raise ValidationFailed("batch_size and events_per_transaction must be at least 1")
    deletable = Run.objects.filter(status__in=TERMINAL, ended_at__lt=ended_before).exclude(
        pk__in=_purge_blocked(ended_before=ended_before)
    )
    if dry_run:
        selected = deletable.values("pk")
        return PurgeResult(
            runs=deletable.count(),
            events=RunEvent.objects.filter(run_id__in=selected).count(),
            attempts=RunAttempt.objects.filter(run_id__in=selected).count(),
            batches=0,
            webhook_deliveries=_deliveries_over().count(),
        )
    runs = events = attempts = batches = 0
    while True:
        ids = list(deletable.order_by("ended_at", "id").values_list("pk", flat=True)[:batch_size])
        if not ids:
            break
        # The events first, a bounded number per transaction: a batch of runs may carry millions.
        # Nothing appends to a terminal run, so its events can go before it does; a purge stopped
        # midway leaves runs with fewer events, which the next purge deletes.
        events += _delete_events(_with_descendants(ids), per_transaction=events_per_transaction)
        with transaction.atomic(durable=True):
            # Children of a deletable run are deletable too; the cascade takes them in this batch.
            _, per_model = Run.objects.filter(pk__in=ids).delete()
        runs += per_model.get(Run._meta.label, 0)
        events += per_model.get(RunEvent._meta.label, 0)
        attempts += per_model.get(RunAttempt._meta.label, 0)
        batches += 1
    return PurgeResult(
        runs=runs,
        events=events,
        attempts=attempts,
        batches=batches,
        idempotency_records=_purge_idempotency(),
        auth_failures=auth_failures_purge(),
        webhook_deliveries=_purge_deliveries(),
    )


def _with_descendants(ids: list[UUID]) -> list[UUID]:
    found, frontier = list(ids), list(ids)
    while frontier:
        frontier = list(Run.objects.filter(parent_id__in=frontier).values_list("pk", flat=True))
        found += frontier
    return found


def _delete_events(run_ids: Iterable[UUID], *, per_transaction: int) -> int:
    deleted = 0
    while True:
        with transaction.atomic(durable=True):
            chunk = RunEvent.objects.filter(run_id__in=list(run_ids)).values_list("pk", flat=True)[:per_transaction]
            count, _ = RunEvent.objects.filter(pk__in=list(chunk)).delete()
        deleted += count
        if count < per_transaction:
            return deleted


def _purge_idempotency() -> int:
    expired = timezone.now() - timedelta(seconds=conf.IDEMPOTENCY_TTL_SECONDS)
    deleted = 0
    while True:
        with transaction.atomic(durable=True):
            chunk = IdempotencyRecord.objects.filter(created_at__lt=expired).values_list("pk", flat=True)[:1000]
            count, _ = IdempotencyRecord.objects.filter(pk__in=list(chunk)).delete()
        deleted += count
        if count < 1000:
            return deleted


def _deliveries_over() -> QuerySet[WebhookDelivery]:
    """Deliveries of runs no longer kept that are over: given up, or delivered more than
    RUNLEDGER_WEBHOOKS_KEEP_DAYS ago. (A dry run counts those whose run is already gone.)"""
    kept_since = timezone.now() - timedelta(days=conf.WEBHOOKS_KEEP_DAYS)
    over = Q(status=DeliveryStatus.FAILED) | Q(status=DeliveryStatus.DELIVERED, delivered_at__lt=kept_since)
    return WebhookDelivery.objects.filter(over).exclude(run_id__in=Run.objects.values("pk"))


def _purge_deliveries() -> int:
    """Delete the deliveries `_deliveries_over` finds, with their attempts' log, then the
    notifications no delivery points at any more (their bodies), a thousand a transaction. Runs
    go first: a delivery outlives its run only while it is pending or kept."""
    deleted = 0
    while True:
        with transaction.atomic(durable=True):
            chunk = list(_deliveries_over().values_list("pk", flat=True)[:1000])
            _, per_model = WebhookDelivery.objects.filter(pk__in=chunk).delete()
        deleted += per_model.get(WebhookDelivery._meta.label, 0)
        if len(chunk) < 1000:
            break
    while True:
        with transaction.atomic(durable=True):
            bodies = list(
                WebhookNotification.objects.filter(deliveries__isnull=True).values_list("pk", flat=True)[:1000]
            )
            WebhookNotification.objects.filter(pk__in=bodies).delete()
        if len(bodies) < 1000:
            return deleted
