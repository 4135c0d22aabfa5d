"""The commands people and programs send a run: cancel, stop, pause, resume
(docs/design/commands.md).

Each is one transaction under the run's row lock. Cancel and stop commit the terminal state
themselves; the worker holding the run hears of it through the control notification (or its
re-read) and stops.
"""

import secrets
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.db import transaction
from django.utils import timezone

from runs import access, notify
from runs.access import User
from runs.events import EventType, WaitReason
from runs.exceptions import StaleTicket, ValidationFailed
from runs.models import Run, RunEvent
from runs.services.core import (
    APPENDED,
    SYSTEM,
    end,
    event_rows,
    has_room,
    lock_run,
    no_room,
    park,
    require_transition,
    write_appended,
)
from runs.services.creation import check_input
from runs.services.quotas import check_stored_bytes
from runs.services.statements import holding, send_together, update
from runs.storable import json_bytes, same_json
from runs.transitions import CALLER_STOP_CODES, CancelCode, Status, StopCode


def lock_for(run_id: UUID | str, caller: User | None, rule: access.Rule, *, ending: bool = False) -> Run:
    """Lock the run; with `caller`, refuse them by `rule` (runs.access.require) on the row locked:
    one read serves the checks and the command, and a refusal writes nothing. `caller` is the API's,
    internal: host code checks before it calls (docs/reference/python.md). `ending`: the command
    may end or park the run (`runs.services.core.lock_run`)."""
    run = lock_run(run_id, ending=ending)
    if caller is not None:
        access.require(caller, run, rule, run_id=run_id)
    return run


@dataclass(frozen=True)
class CommandResult:
    """What a command did: `run` is the run as the command left it (committed); `changed` is False
    when the command found the run already as it asks (or a resume retried) and wrote nothing;
    `pending` is True when a running run's pause was recorded and its worker will park it (the
    API's 202)."""

    run: Run
    changed: bool
    pending: bool = False


def run_cancel(*, run_id: UUID | str, actor: User, note: str = "", caller: User | None = None) -> CommandResult:
    """Cancel the run `run_id`, and every unfinished run under it, as `actor` (its `ended_by`; the
    code `cancelled_by_user` when `actor` owns it, else `cancelled_by_staff`), with `note` as its
    `end_reason`. It commits before it returns; a worker executing the run hears of it and stops
    (docs/design/commands.md#cancel). A run already cancelled is left as it is (`changed` False).

    Raises `NotFound` for no such run and `InvalidTransition` for a run that ended otherwise. Who may
    cancel is the caller's to check (`runs.access.can_cancel`: the owner, and holders of
    `runs.cancel_run`). `caller`, internal: the API's user, checked on the locked run."""
    with transaction.atomic(durable=True), holding():
        return cancel_locked(lock_for(run_id, caller, access.CANCEL, ending=True), actor=actor, note=note)


def cancel_locked(run: Run, *, actor: User, note: str) -> CommandResult:
    """`run_cancel`'s write, on the run its caller locked (a bulk command's)."""
    if run.status == Status.CANCELLED:
        return CommandResult(run=run, changed=False)
    # Cancelling one's own run is a user cancel even for holders of runs.cancel_run.
    code = CancelCode.BY_USER if actor.pk == run.owner_id else CancelCode.BY_STAFF
    end(run, Status.CANCELLED, code=code, reason=note, by=actor.get_username(), now=timezone.now())
    return CommandResult(run=run, changed=True)


def run_stop(
    *, run_id: UUID | str, actor: User | None, code: str = StopCode.STAFF, reason: str, caller: User | None = None
) -> CommandResult:
    """Stop the run `run_id`, and every unfinished run under it: the host's or staff's policy end
    (docs/design/commands.md#stop). `actor` is recorded as `ended_by` (None: `system`), `code` is one
    of `staff`, `policy`, `budget_exhausted` and `deadline_exceeded`, and `reason`, required, is its
    `end_reason`. A run already stopped is left as it is (`changed` False).

    Raises `ValidationFailed` for another code or no reason, `NotFound` for no such run and
    `InvalidTransition` for a run that ended otherwise. Who may stop is the caller's to check
    (`runs.access.can_stop`: `runs.stop_run`). `caller`, internal: the API's user, checked on the locked run."""
    if code not in CALLER_STOP_CODES:
        allowed = ", ".join(sorted(CALLER_STOP_CODES))
        raise ValidationFailed(f"stop code must be one of {allowed}", detail={"code": [f"must be one of {allowed}"]})
    if not reason or not reason.strip():
        raise ValidationFailed("a stop needs a reason", detail={"reason": ["this field is required"]})
    with transaction.atomic(durable=True), holding():
        return stop_locked(lock_for(run_id, caller, access.STOP, ending=True), actor=actor, code=code, reason=reason)


def stop_locked(run: Run, *, actor: User | None, code: str, reason: str) -> CommandResult:
    """`run_stop`'s write, its code and reason checked, on the run its caller locked (a bulk
    command's)."""
    if run.status == Status.STOPPED:
        return CommandResult(run=run, changed=False)
    by = actor.get_username() if actor is not None else SYSTEM
    end(run, Status.STOPPED, code=code, reason=reason, by=by, now=timezone.now())
    return CommandResult(run=run, changed=True)


def run_pause(*, run_id: UUID | str, caller: User | None = None) -> CommandResult:
    """Pause the run `run_id` (docs/design/commands.md#pause): a queued run waits at once, with a
    resume ticket; a running one is parked by its worker at its next safe boundary (`pending` True);
    a waiting one is left as it is (`changed` False).

    Raises `NotFound` for no such run, `InvalidTransition` for an ended one and `BudgetExhausted`
    when its events would pass the run's `max_events`. Who may pause is the caller's to check
    (`runs.access.can_pause_resume`). `caller`, internal: the API's user, checked on the locked run."""
    with transaction.atomic(durable=True):
        run = lock_for(run_id, caller, access.PAUSE_RESUME, ending=True)
        now = timezone.now()
        if run.status == Status.WAITING:
            return CommandResult(run=run, changed=False)
        if run.status == Status.RUNNING:
            if run.pause_requested_at is not None:
                return CommandResult(run=run, changed=False, pending=True)
            # Refused now rather than promised: the worker's park writes a seal for each open tool
            # call and `run.waiting`, and past the budget it would have to stop the run instead.
            needed = len(run.open_tool_calls) + 1
            if not has_room(run, needed):
                raise no_room(run, needed, "a pause")
            run.pause_requested_at = now
            run.updated_at = now
            noted = notify.statement(notify.control_changed(run.id, run.status))
            send_together(update(run, ["pause_requested_at", "updated_at"]), *([noted] if noted else []))
            return CommandResult(run=run, changed=True, pending=True)
        park(run, WaitReason.PAUSED, prompt=None, attempt=None, now=now)  # queued → waiting; terminal raises
    return CommandResult(run=run, changed=True)


def run_resume(*, run_id: UUID | str, ticket: str, input: Any = None, caller: User | None = None) -> CommandResult:
    """Resume the waiting run `run_id` with its current `ticket` (`run.resume_ticket`), handing its
    agent `input`, any JSON value (docs/design/commands.md#resume). The same resume retried, with the
    same ticket and input, after it succeeded changes nothing (`changed` False).

    Raises `ValidationFailed` for no ticket or input its agent refuses, `NotFound` for no such run,
    `StaleTicket` for a ticket that is not the run's current one, `BudgetExhausted` past the run's
    `max_events`, and `TooManyRequests` past the owner's stored bytes. Who may resume is the caller's
    to check (`runs.access.can_pause_resume`). `caller`, internal: the API's user, checked on the locked run."""
    if not ticket:
        raise ValidationFailed("a resume needs the run's ticket", detail={"ticket": ["this field is required"]})
    with transaction.atomic(durable=True):
        run = lock_for(run_id, caller, access.PAUSE_RESUME)
        # Bounded like a create's input, and before the run's state is looked at
        # (docs/design/api.md#check-order: 400 before 409); the agent's check needs the run, hence
        # under the lock.
        check_input(run.agent, input)
        if run.status != Status.WAITING or not secrets.compare_digest(run.resume_ticket.encode(), ticket.encode()):
            if _already_resumed(run, ticket=ticket, input=input):
                return CommandResult(run=run, changed=False)
            raise StaleTicket("the resume ticket is stale, used or invalidated", run=run)
        require_transition(run, Status.QUEUED)
        if not has_room(run, 1):
            raise no_room(run, 1, "a resume")
        resumed = {"ticket": ticket, "input": input}
        # The input is stored (in `run.resumed`): it counts against the owner's bytes like a create's.
        check_stored_bytes(run.owner_id, adding_bytes=json_bytes(resumed))
        now = timezone.now()
        run.status = Status.QUEUED
        run.resume_ticket = ""
        run.updated_at = now
        run.queued_at = now
        run.events_used += 1
        rows = event_rows(run, [(EventType.RUN_RESUMED, resumed)], attempt=None, now=now)
        fields = ["status", "resume_ticket", "updated_at", "queued_at", *APPENDED, "events_used"]
        write_appended(run, rows, fields=fields, notes=[notify.run_queued(run.id)])
    return CommandResult(run=run, changed=True)


def _already_resumed(run: Run, *, ticket: str, input: Any) -> bool:
    """True when this very resume (ticket and input) is the run's latest: a client that lost the
    first answer retries safely. Once the run waits again, that ticket is stale like any other.
    "The same input" is the rule of an idempotent create's "the same body" (`same_json`)."""
    latest = (
        RunEvent.objects.filter(run=run, type__in=[EventType.RUN_WAITING, EventType.RUN_RESUMED])
        .order_by("-seq")
        .values_list("type", "data")
        .first()
    )
    if latest is None or latest[0] != EventType.RUN_RESUMED:
        return False
    used = latest[1]
    same_ticket = secrets.compare_digest(str(used.get("ticket", "")).encode(), ticket.encode())
    return same_ticket and same_json(used.get("input"), input)
