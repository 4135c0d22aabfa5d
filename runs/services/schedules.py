"""Schedules created, changed, paused, resumed, triggered, backfilled and deleted
(docs/design/schedules.md#commands). Each one transaction under the schedule's row lock; bad input
is a ValidationFailed naming the field, before anything is written. The firing is
runs.services.firing's."""

from datetime import datetime
from typing import Any
from uuid import UUID

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from runs import notify
from runs.access import User
from runs.agents import is_registered, registered_names
from runs.conf import conf
from runs.exceptions import NotFound, ValidationFailed
from runs.metadata import check_metadata
from runs.models import PRIORITY_MIN, URGENT_MAX, Overlap, Run, Schedule
from runs.recurrence import Rule, cron_problem, zone_problem
from runs.selectors.schedules import schedules_visible
from runs.services.creation import RunSpec, check_input
from runs.services.firing import backfill_locked, first_due, rule_of, trigger_locked
from runs.services.quotas import check_schedules

# Holders may schedule more often than RUNLEDGER_MIN_SCHEDULE_SECONDS (docs/design/schedules.md#limits).
SCHEDULE_OFTEN = "runs.schedule_often"
# A catch-up window longer than a day would bring back the herd it exists to prevent.
CATCHUP_WINDOW_MAX = 86_400
# The most runs one backfill creates.
BACKFILL_MAX = 1000
# What `schedule_update` may change; the rest is the schedule's own.
CHANGEABLE = (
    "agent",
    "input",
    "metadata",
    "priority",
    "cron",
    "every_seconds",
    "timezone",
    "overlap",
    "catchup_window_seconds",
    "start_at",
    "end_at",
)
# Changes that move the due times: the next one is worked out again from now.
TIMING = frozenset({"cron", "every_seconds", "timezone", "start_at", "end_at"})


def _refuse(field: str, problem: str) -> ValidationFailed:
    return ValidationFailed(f"{field} {problem}", detail={field: [problem]})


def _when(field: str, value: Any) -> datetime | None:
    if value is None:
        return None
    when = parse_datetime(value) if isinstance(value, str) else value
    if not isinstance(when, datetime) or timezone.is_naive(when):
        raise _refuse(field, "must be a date and time with its offset (ISO 8601)")
    return when


def _whole(field: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _refuse(field, f"must be a whole number of at least {minimum}")
    return value


def check_fields(fields: dict[str, Any], *, owner: User, now: datetime) -> dict[str, Any]:
    """`fields` (every one of `CHANGEABLE`) as stored, or ValidationFailed naming the first field
    at fault: the run's own rules for what each run gets, then the schedule's."""
    checked = dict(fields)
    agent = fields["agent"]
    if not isinstance(agent, str) or not is_registered(agent):
        known = ", ".join(registered_names()) or "none"
        raise _refuse("agent", f"is not a registered agent; registered agents: {known}")
    if not isinstance(fields["input"], dict):
        raise _refuse("input", "must be a JSON object")
    check_input(agent, fields["input"])
    checked["metadata"] = check_metadata(fields["metadata"] if fields["metadata"] is not None else {})
    priority = fields["priority"]
    if isinstance(priority, bool) or not isinstance(priority, int) or not PRIORITY_MIN <= priority <= URGENT_MAX:
        raise _refuse("priority", f"must be a whole number between {PRIORITY_MIN} and {URGENT_MAX}")
    # As for a run: above 100 needs runs.prioritize_run (docs/design/fair-use.md#priority).
    RunSpec(agent=agent, input={}, priority=priority).check_owner(owner)
    cron, every = fields["cron"] or "", fields["every_seconds"]
    if not isinstance(cron, str):
        raise _refuse("cron", "must be a cron expression")
    if bool(cron) == (every is not None):
        message = "give exactly one of cron and every_seconds"
        raise ValidationFailed(message, detail={"cron": [message], "every_seconds": [message]})
    if cron and (problem := cron_problem(cron)) is not None:
        raise _refuse("cron", problem)
    if every is not None:
        checked["every_seconds"] = _whole("every_seconds", every, minimum=1)
    checked["cron"] = cron.strip()
    zone = fields["timezone"]
    if not isinstance(zone, str) or (problem := zone_problem(zone)) is not None:
        raise _refuse("timezone", problem or "must be an IANA time zone name")
    if fields["overlap"] not in Overlap.values:
        raise _refuse("overlap", f"must be one of {', '.join(Overlap.values)}")
    window = _whole("catchup_window_seconds", fields["catchup_window_seconds"], minimum=0)
    if window > CATCHUP_WINDOW_MAX:
        raise _refuse("catchup_window_seconds", f"must be at most {CATCHUP_WINDOW_MAX} (a day)")
    checked["start_at"] = start = _when("start_at", fields["start_at"])
    checked["end_at"] = end = _when("end_at", fields["end_at"])
    if start is not None and end is not None and end <= start:
        raise _refuse("end_at", "must be after start_at")
    minimum = conf.MIN_SCHEDULE_SECONDS
    rule = Rule(cron=checked["cron"], every_seconds=checked["every_seconds"], zone=zone, anchor=start or now)
    # Five fields never come closer than a minute: a cron is looked at only under a longer minimum.
    judged = minimum > (60 if cron else 0)
    if judged and rule.shortest_gap(now) < minimum and not owner.has_perm(SCHEDULE_OFTEN):
        field = "cron" if cron else "every_seconds"
        raise _refuse(
            field, f"fires more often than every {minimum} s (RUNLEDGER_MIN_SCHEDULE_SECONDS; {SCHEDULE_OFTEN} may)"
        )
    return checked


def schedule_create(
    *,
    owner: User,
    agent: str,
    input: dict[str, Any],
    metadata: dict[str, str] | None = None,
    priority: int = 0,
    cron: str = "",
    every_seconds: int | None = None,
    timezone: str = "UTC",
    overlap: str = Overlap.SKIP,
    catchup_window_seconds: int = 0,
    start_at: datetime | None = None,
    end_at: datetime | None = None,
) -> Schedule:
    """A new schedule of `owner`, active, its first due time the first after now (and at or after
    `start_at`). Raises ValidationFailed naming the field at fault (an unknown agent, input its agent
    refuses, a bad cron or zone, both or neither of cron and every_seconds, one shorter than
    RUNLEDGER_MIN_SCHEDULE_SECONDS without runs.schedule_often, a priority above 100 without
    runs.prioritize_run, end before start), then TooManyRequests past RUNLEDGER_MAX_SCHEDULES_PER_USER."""
    now = _now()
    given = {
        "agent": agent,
        "input": input,
        "metadata": metadata,
        "priority": priority,
        "cron": cron,
        "every_seconds": every_seconds,
        "timezone": timezone,
        "overlap": overlap,
        "catchup_window_seconds": catchup_window_seconds,
        "start_at": start_at,
        "end_at": end_at,
    }
    fields = check_fields(given, owner=owner, now=now)
    schedule = Schedule(
        owner=owner,  # type: ignore[misc]  # AUTH_USER_MODEL
        anchor=fields["start_at"] or now,
        created_at=now,
        updated_at=now,
        **fields,
    )
    schedule.next_due_at = first_due(rule_of(schedule), now=now, start_at=schedule.start_at, end_at=schedule.end_at)
    with transaction.atomic(durable=True):
        check_schedules(owner.pk)
        schedule.save(force_insert=True)
        notify.send(notify.schedules_changed())
    return schedule


def lock_schedule(schedule_id: UUID | str, actor: User) -> Schedule:
    """The schedule, locked until the transaction ends, if `actor` may act on it; else NotFound."""
    # FOR NO KEY UPDATE: a run inserted with it as its schedule takes FOR KEY SHARE through the
    # foreign key, and must not wait for this lock (the fire inserts one under it).
    try:
        return schedules_visible(user=actor).select_for_update(no_key=True, of=("self",)).get(pk=schedule_id)
    except (Schedule.DoesNotExist, ValueError, DjangoValidationError) as exc:
        raise NotFound(f"schedule {schedule_id} not found") from exc


def schedule_update(*, schedule_id: UUID | str, actor: User, **changes: Any) -> Schedule:
    """Change the schedule (a PATCH: the fields named in `changes`, the rules of `schedule_create`).
    Giving one of cron and every_seconds a value clears the other. A change of its timing works out
    the next due time again from now; an interval's anchor is then its start_at, or now."""
    unknown = sorted(set(changes) - set(CHANGEABLE))
    if unknown:
        raise ValidationFailed(
            f"unknown fields: {', '.join(unknown)}", detail={name: ["is not a field of a schedule"] for name in unknown}
        )
    if changes.get("cron") and "every_seconds" not in changes:
        changes["every_seconds"] = None
    elif changes.get("every_seconds") is not None and "cron" not in changes:
        changes["cron"] = ""
    now = _now()
    with transaction.atomic(durable=True):
        schedule = lock_schedule(schedule_id, actor)
        current = {name: getattr(schedule, name) for name in CHANGEABLE}
        fields = check_fields(current | changes, owner=schedule.owner, now=now)
        if fields["overlap"] != Overlap.BUFFER_ONE:
            # A due time kept by buffer_one would otherwise still fire under the new policy.
            schedule.buffered_due_at = None
        for name, value in fields.items():
            setattr(schedule, name, value)
        if TIMING & set(changes):
            if {"every_seconds", "start_at"} & set(changes):
                schedule.anchor = schedule.start_at or now
            schedule.next_due_at = first_due(
                rule_of(schedule), now=now, start_at=schedule.start_at, end_at=schedule.end_at
            )
        schedule.updated_at = now
        schedule.save()
        notify.send(notify.schedules_changed())
    return schedule


def schedule_delete(*, schedule_id: UUID | str, actor: User) -> None:
    """Delete the schedule; the runs it created stay (their `schedule` becomes null)."""
    with transaction.atomic(durable=True):
        lock_schedule(schedule_id, actor).delete()


def schedule_pause(*, schedule_id: UUID | str, actor: User) -> Schedule:
    """Pause the schedule: no due time fires until it is resumed, and a `buffer_one` due time
    waiting is dropped. Pausing a paused schedule changes nothing."""
    with transaction.atomic(durable=True):
        schedule = lock_schedule(schedule_id, actor)
        if not schedule.paused:
            schedule.paused, schedule.buffered_due_at, schedule.updated_at = True, None, _now()
            schedule.save(update_fields=["paused", "buffered_due_at", "updated_at"])
    return schedule


def schedule_resume(*, schedule_id: UUID | str, actor: User) -> Schedule:
    """Resume the schedule: its next due time is the first after now, so the due times it missed
    while paused never fire (no herd). Resuming an active schedule changes nothing."""
    now = _now()
    with transaction.atomic(durable=True):
        schedule = lock_schedule(schedule_id, actor)
        if schedule.paused:
            schedule.paused, schedule.updated_at = False, now
            schedule.next_due_at = first_due(
                rule_of(schedule), now=now, start_at=schedule.start_at, end_at=schedule.end_at
            )
            schedule.save(update_fields=["paused", "next_due_at", "updated_at"])
            notify.send(notify.schedules_changed())
    return schedule


def schedule_trigger(*, schedule_id: UUID | str, actor: User) -> Run | None:
    """Fire the schedule now, once, its due time now, whether paused or not; its next due time
    stays. The overlap policy applies: None when no run was created now (`skip` with its last run
    live — `schedule.skipped` is sent —, or `buffer_one`, whose run comes when the live one ends).
    Raises what a run's create raises at the owner's caps (TooManyRequests)."""
    with transaction.atomic(durable=True):
        schedule = lock_schedule(schedule_id, actor)
        return trigger_locked(schedule, now=_now())


def schedule_backfill(*, schedule_id: UUID | str, actor: User, start: datetime, end: datetime, max: int) -> list[Run]:
    """Create the runs of the schedule's due times from `start` to `end` (both included, `end` not
    after now), oldest first, at most `max`, whatever its overlap policy; a due time that has its run
    already (fired, or backfilled before) is passed over, so a backfill retried creates nothing twice.
    All or nothing: the owner's caps refuse the whole (TooManyRequests)."""
    start_at, end_at = _when("from", start), _when("to", end)
    limit = _whole("max", max, minimum=1)
    if limit > BACKFILL_MAX:
        raise _refuse("max", f"must be at most {BACKFILL_MAX}")
    assert start_at is not None and end_at is not None
    now = _now()
    if end_at <= start_at:
        raise _refuse("to", "must be after from")
    if end_at > now:
        raise _refuse("to", "must not be in the future: those due times are the schedule's to fire")
    with transaction.atomic(durable=True):
        schedule = lock_schedule(schedule_id, actor)
        return backfill_locked(schedule, start=start_at, end=end_at, limit=limit, now=now)


def _now() -> datetime:
    return timezone.now()


__all__ = [
    "schedule_backfill",
    "schedule_create",
    "schedule_delete",
    "schedule_pause",
    "schedule_resume",
    "schedule_trigger",
    "schedule_update",
]
