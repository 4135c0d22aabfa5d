"""Reads of schedules (docs/design/schedules.md): one's own, by id or paged, and the late ones."""

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import DurationField, ExpressionWrapper, F, QuerySet
from django.db.models.functions import Now
from django.utils import timezone

from runs.access import AnyUser
from runs.exceptions import NotFound
from runs.models import Schedule
from runs.selectors.run_json import _time

# Staff who may change any run may read and change any schedule, as webhook endpoints.
SCHEDULES_OF_ANYONE = "runs.change_run"


# Of a schedule's last run only its id and status are read (its JSON, the overlap policy, the
# admin's badge): never its input, output or error, which may weigh hundreds of kB each.
LAST_RUN_LEFT_OUT = tuple(
    f"last_run__{name}" for name in ("input", "output", "error", "metadata", "reported_usage", "open_tool_calls")
)


def with_owner_and_last_run(schedules: QuerySet[Schedule]) -> QuerySet[Schedule]:
    """`schedules` with their owner and the light part of their last run, in the same statement."""
    return schedules.select_related("owner", "last_run").defer(*LAST_RUN_LEFT_OUT)


def schedules_visible(*, user: AnyUser) -> QuerySet[Schedule]:
    """The schedules `user` may read and change: their own (with runs.change_run: everyone's)."""
    if not user.is_authenticated:
        return Schedule.objects.none()
    schedules = with_owner_and_last_run(Schedule.objects.all())
    return schedules if user.has_perm(SCHEDULES_OF_ANYONE) else schedules.filter(owner_id=user.pk)


def schedule_get(*, user: AnyUser, schedule_id: UUID | str) -> Schedule:
    """The schedule `schedule_id` among those `user` may see, else `NotFound` (another user's too:
    a 404, never a 403)."""
    try:
        return schedules_visible(user=user).get(pk=schedule_id)
    except (Schedule.DoesNotExist, ValueError, DjangoValidationError) as exc:
        raise NotFound(f"schedule {schedule_id} not found") from exc


def schedule_list(*, user: AnyUser) -> QuerySet[Schedule]:
    """`user`'s schedules, newest first (`-created_at`, `-id` for a unique order the cursor pages
    by); through `schedule_owner_created` for an owner's own."""
    return schedules_visible(user=user).order_by("-created_at", "-id")


def schedules_next_due_in() -> float | None:
    """Seconds until the soonest due time of an active schedule, by the database's clock (≤ 0: one
    is due); None when none has one. One read of the `schedule_due` index: the scheduler sleeps no
    longer than this (docs/design/schedules.md#scheduler)."""
    ahead = ExpressionWrapper(F("next_due_at") - Now(), output_field=DurationField())
    soonest = (
        Schedule.objects.filter(paused=False, next_due_at__isnull=False)
        .order_by("next_due_at")
        .values_list(ahead, flat=True)
        .first()
    )
    return None if soonest is None else soonest.total_seconds()


# A schedule is late once its due time is this far behind: the scheduler fires within a second
# while a worker is up (docs/design/schedules.md#scheduler).
LATE_AFTER = timedelta(seconds=5)


def schedules_late(*, now: datetime | None = None, limit: int = 20) -> list[Schedule]:
    """Active schedules whose due time passed more than `LATE_AFTER` ago, most late first: no
    worker is firing them (the dashboard's list). One read of the `schedule_due` index."""
    now = now or timezone.now()
    late = Schedule.objects.filter(paused=False, next_due_at__lt=now - LATE_AFTER)
    return list(with_owner_and_last_run(late).order_by("next_due_at")[:limit])


def schedule_json(schedule: Schedule, *, with_input: bool = True) -> dict[str, Any]:
    """The schedule as the API answers it (docs/design/schedules.md#json); a webhook's body leaves
    its `input` out (`with_input`): a notification per due time must not store it again and again."""
    last = schedule.last_run
    data: dict[str, Any] = {
        "id": str(schedule.id),
        "agent": schedule.agent,
        "input": schedule.input if with_input else None,
        "metadata": dict(schedule.metadata),
        "priority": schedule.priority,
        "cron": schedule.cron,
        "every_seconds": schedule.every_seconds,
        "timezone": schedule.timezone,
        "overlap": str(schedule.overlap),
        "catchup_window_seconds": schedule.catchup_window_seconds,
        "start_at": _time(schedule.start_at),
        "end_at": _time(schedule.end_at),
        "paused": schedule.paused,
        "next_due_at": _time(schedule.next_due_at),
        "last_run": None if last is None else {"id": str(last.id), "status": str(last.status)},
        "created_at": _time(schedule.created_at),
        "updated_at": _time(schedule.updated_at),
    }
    return data
