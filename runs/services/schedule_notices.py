"""What a schedule tells webhooks (docs/design/schedules.md#webhooks): a due time skipped by its
overlap policy, or one whose run could not be created; written in the fire's own transaction through
the webhook outbox, once per due time."""

from datetime import UTC, datetime

from runs import notify
from runs.models import Schedule, WebhookEndpoint
from runs.selectors.schedules import schedule_json
from runs.services.statements import from_row, send_together
from runs.services.webhooks import endpoints_of, matches, notification_writes

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def due_key(due_at: datetime) -> int:
    """A due time as its notification's `seq`: microseconds since the epoch, so that the outbox's
    one notification per (id, seq) is one per due time."""
    delta = due_at - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def tell(schedule: Schedule, event_type: str, *, due_at: datetime, reason: str, now: datetime) -> None:
    """Write `event_type`'s notification of `due_at` to the endpoints that want it; the caller holds
    the schedule's lock, and saves its `told`. Its body carries the schedule (without its input), the
    due time and why. Only the first of a streak: what was told last, since the schedule's last run
    was created, is not told again. With no endpoint: one indexed read."""
    if schedule.told == event_type:
        return
    schedule.told = event_type
    (rows,) = send_together(endpoints_of(schedule.owner_id))
    endpoints = (from_row(WebhookEndpoint, row) for row in rows)
    wanted = [endpoint.id for endpoint in endpoints if matches(endpoint, schedule, event_type)]
    if not wanted:
        return
    data: dict[str, object] = {
        "schedule": schedule_json(schedule, with_input=False),
        "due_at": due_at.isoformat().replace("+00:00", "Z"),
        "reason": reason,
    }
    writes, _ = notification_writes((schedule.id, due_key(due_at)), event_type, data=data, endpoint_ids=wanted, now=now)
    send_together(*writes)
    notify.send(notify.webhooks_due())
