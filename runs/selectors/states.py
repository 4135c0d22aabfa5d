"""The state of runs by id, many in one query, for the processes that follow runs rather than show
them (docs/design/streaming.md#hub): a worker re-reading the runs it holds, the stream hub's poll
backstop, the edge's publisher and the streams' re-check. No visibility rule: each caller has
checked who may see the run already, or shows nothing of it."""

from collections.abc import Collection
from datetime import datetime
from uuid import UUID

from django.db.models import DurationField, ExpressionWrapper, F
from django.db.models.functions import Now

from runs.models import LIVE_VALUES, Run
from runs.transitions import Status


def run_worker_states(*, run_ids: Collection[UUID]) -> dict[UUID, tuple[str, int, datetime | None]]:
    """(status, generation, pause requested at) of each run that still exists: what says whether
    a worker's attempt of it must stop or pause."""
    rows = Run.objects.filter(pk__in=run_ids).values_list("id", "status", "generation", "pause_requested_at")
    return {run_id: (status, generation, pause) for run_id, status, generation, pause in rows}


def run_last_seqs(*, run_ids: Collection[str]) -> dict[str, int]:
    """The seq of each existing run's last event."""
    rows = Run.objects.filter(pk__in=run_ids).values_list("pk", "last_seq")
    return {str(pk): last_seq for pk, last_seq in rows}


def run_last_seqs_live() -> dict[str, int]:
    """The seq of every live run's last event, through the live-runs partial index."""
    rows = Run.objects.filter(status__in=LIVE_VALUES).values_list("pk", "last_seq")
    return {str(pk): last_seq for pk, last_seq in rows}


def run_last_seqs_ended_since(*, since: datetime) -> dict[str, int]:
    """The seq of the last event of every run that ended at or after `since`, through the
    ended-runs partial index."""
    rows = Run.objects.filter(ended_at__gte=since).values_list("pk", "last_seq")
    return {str(pk): last_seq for pk, last_seq in rows}


def run_status_last_seq(*, run_id: str) -> tuple[str, int] | None:
    """A run's status and the seq of its last event; None once it is deleted."""
    return Run.objects.filter(pk=run_id).values_list("status", "last_seq").first()


def run_ids_live(*, run_ids: Collection[str]) -> set[str]:
    """Those of `run_ids` whose run is live (not ended, not deleted)."""
    return {str(pk) for pk in Run.objects.filter(pk__in=run_ids, status__in=LIVE_VALUES).values_list("pk", flat=True)}


def run_owners(*, run_ids: Collection[str]) -> dict[str, int]:
    """The owner's user id of each existing run."""
    return {str(pk): owner for pk, owner in Run.objects.filter(pk__in=run_ids).values_list("pk", "owner_id")}


def queue_next_start_in() -> float | None:
    """Seconds until the soonest `start_after` of a queued run still ahead, by the database's clock
    (through `run_queued_start`); None when no queued run waits for its time. A worker with nothing
    to claim sleeps no longer than this (docs/design/fair-use.md#start-after)."""
    ahead = ExpressionWrapper(F("start_after") - Now(), output_field=DurationField())
    soonest = (
        Run.objects.filter(status=Status.QUEUED, start_after__gt=Now())
        .order_by("start_after")
        .values_list(ahead, flat=True)
        .first()
    )
    return None if soonest is None else soonest.total_seconds()
