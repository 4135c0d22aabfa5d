"""The run's JSON (docs/design/api.md#run-json): the one representation of a run that the API answers,
a 409 carries and a webhook's body holds. Plain code, so that the services (the webhook outbox)
import it without the API; the API's serializers declare its schema and answer with it."""

from datetime import datetime, tzinfo
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db.models import F, Prefetch, QuerySet
from django.utils import timezone

from runs.models import Run, RunAttempt
from runs.selectors.compiled import CompiledRead, Param, as_first
from runs.selectors.results import run_partial_output, run_usage

# The current attempt read with the run itself (`runs.selectors.run_get(for_json=True)`).
JOINED_ATTEMPT = "joined_attempt"

# What a list item may leave out or cut (its `truncated`), in this order.
LIST_CUT_FIELDS = ["input", "output", "error", "end_reason"]


def run_json(run: Run, *, ticket: bool = False) -> dict[str, Any]:
    """The run as JSON; its `resume_ticket` only with `ticket` (for those who may resume it:
    `runs.access.can_see_ticket`)."""
    return _json(run, ticket=ticket, listed=False)


def run_list_item_json(run: Run, *, ticket: bool = False) -> dict[str, Any]:
    """A run of a list (`runs.selectors.run_list_values`, `run_with_current_attempt`): `run_json`
    with its big values as the list reads them, no `partial_output`, and `truncated`."""
    data = _json(run, ticket=ticket, listed=True)
    data["truncated"] = [name for name in LIST_CUT_FIELDS if getattr(run, f"{name}_cut")]
    return data


def _json(run: Run, *, ticket: bool, listed: bool) -> dict[str, Any]:
    # The field order is the schema's (runs.api.serializers.RunOutputSerializer), which a test holds.
    prefix = "listed_" if listed else ""
    # The current time zone looked up once for the run's nine times (each lookup reads a context-local).
    zone = timezone.get_current_timezone()
    data: dict[str, Any] = {
        "id": str(run.id),
        "agent": run.agent,
        "input": _dict(getattr(run, f"{prefix}input")),
        "metadata": {str(key): None if value is None else str(value) for key, value in run.metadata.items()},
        "owner": run.owner.get_username(),
        "status": str(run.status),
        "created_at": _time(run.created_at, zone),
        "started_at": _time(run.started_at, zone),
        "ended_at": _time(run.ended_at, zone),
        "end_code": run.end_code,
        "end_reason": getattr(run, f"{prefix}end_reason"),
        "ended_by": run.ended_by,
        "output": getattr(run, f"{prefix}output"),
    }
    if not listed:
        # An aggregate over its events: read for the run itself, never for a page of runs.
        data["partial_output"] = run_partial_output(run=run)
    data |= {
        "usage": run_usage(run=run),
        "error": getattr(run, f"{prefix}error"),
        "last_seq": run.last_seq,
        "max_steps": run.max_steps,
        "steps_used": run.steps_used,
        "max_events": run.max_events,
        "events_used": run.events_used,
        "deadline": _time(run.deadline, zone),
        "priority": run.priority,
        "start_after": _time(run.start_after, zone),
        "max_attempts": run.max_attempts,
        "lost_attempts": run.lost_attempts,
        "parent": None if run.parent_id is None else str(run.parent_id),
        "rerun_of": None if run.rerun_of_id is None else str(run.rerun_of_id),
        # Two columns of the run's own row: no read beside it (docs/design/schedules.md#json).
        "schedule": None
        if run.schedule_id is None
        else {"id": str(run.schedule_id), "due_at": _time(run.schedule_due_at, zone)},
    }
    if ticket:
        data["resume_ticket"] = run.resume_ticket or None
    data["attempt"] = _attempt_json(_current_attempt(run), zone)
    return data


def _dict(value: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if value is None else {str(key): item for key, item in value.items()}


def _time(value: datetime | None, zone: tzinfo | None = None) -> str | None:
    """ISO 8601 in the current time zone (`zone`, when the caller has looked it up already), UTC as
    "Z" (what DRF's DateTimeField writes)."""
    if value is None:
        return None
    if settings.USE_TZ:
        value = timezone.localtime(value, zone)
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _current_attempt(run: Run) -> RunAttempt | None:
    # A list prefetches it (`current_attempts`, 0 or 1 item); a run read for its JSON joins it
    # (`run_get(for_json=True)`); another single run reads it.
    if hasattr(run, JOINED_ATTEMPT):
        joined: RunAttempt | None = getattr(run, JOINED_ATTEMPT)
        return joined
    prefetched = getattr(run, "current_attempts", None)
    if prefetched is not None:
        return prefetched[0] if prefetched else None
    return run_current_attempt(run=run)


def _attempt_json(attempt: RunAttempt | None, zone: tzinfo | None = None) -> dict[str, Any] | None:
    if attempt is None:
        return None
    return {
        "generation": attempt.generation,
        "worker": attempt.worker,
        "claimed_at": _time(attempt.claimed_at, zone),
        "heartbeat_at": _time(attempt.heartbeat_at, zone),
        "lease_expires_at": _time(attempt.lease_expires_at, zone),
        "released_at": _time(attempt.released_at, zone),
        "outcome": attempt.outcome or None,
    }


def _attempt(*, run_id: UUID, generation: int) -> QuerySet[RunAttempt]:
    return as_first(RunAttempt.objects.filter(run_id=run_id, generation=generation))


_ATTEMPT = CompiledRead(
    RunAttempt,
    _attempt,
    run_id=Param(RunAttempt._meta.get_field("run"), (UUID(int=1), UUID(int=2))),
    generation=Param(RunAttempt._meta.get_field("generation"), (1_000_000_001, 1_000_000_002)),
)


def run_current_attempt(*, run: Run) -> RunAttempt | None:
    """The run's current attempt, None before its first claim. Compiled once per process
    (runs.selectors.compiled)."""
    if run.generation == 0:
        return None
    found = _ATTEMPT.objects(run_id=run.pk, generation=run.generation)
    return found[0] if found else None


def run_with_current_attempt(*, runs: QuerySet[Run]) -> QuerySet[Run]:
    """Prefetch each run's current attempt into `current_attempts` (0 or 1 item): one query for
    a whole page instead of one per run."""
    current = RunAttempt.objects.filter(generation=F("run__generation"))
    return runs.prefetch_related(Prefetch("attempts", queryset=current, to_attr="current_attempts"))
