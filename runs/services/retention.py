"""Retention: deleting old terminal runs with their events and attempts (`manage.py purge_runs`)."""

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from django.db import transaction

from runs.exceptions import ValidationFailed
from runs.models import Run, RunAttempt, RunEvent
from runs.transitions import TERMINAL


@dataclass(frozen=True)
class PurgeResult:
    runs: int
    events: int
    attempts: int
    batches: int


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


def runs_purge(*, ended_before: datetime, batch_size: int = 500, dry_run: bool = False) -> PurgeResult:
    """Delete terminal runs that ended before `ended_before`, with their events and attempts.

    Live runs (queued, running, waiting) are never touched: only terminal rows qualify, and a
    terminal state is absorbing, so a run selected here cannot come back to life before it goes.
    Each batch is its own transaction, so a large purge never holds one long lock.
    """
    if batch_size < 1:
        raise ValidationFailed("batch_size must be at least 1")
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
        )
    runs = events = attempts = batches = 0
    while True:
        with transaction.atomic(durable=True):
            ids = list(deletable.order_by("ended_at", "id").values_list("pk", flat=True)[:batch_size])
            if not ids:
                break
            # Children of a deletable run are deletable too; the cascade takes them in this batch.
            _, per_model = Run.objects.filter(pk__in=ids).delete()
        runs += per_model.get(Run._meta.label, 0)
        events += per_model.get(RunEvent._meta.label, 0)
        attempts += per_model.get(RunAttempt._meta.label, 0)
        batches += 1
    return PurgeResult(runs=runs, events=events, attempts=attempts, batches=batches)
