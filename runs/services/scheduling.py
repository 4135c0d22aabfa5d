"""Changing when a queued run may start and how it ranks (docs/design/fair-use.md#priority): the
staff console's "schedule" command. One transaction under the run's row lock, like every command."""

from dataclasses import replace
from datetime import datetime
from uuid import UUID

from django.db import transaction
from django.utils import timezone

from runs import notify
from runs.access import User
from runs.exceptions import RunConflict
from runs.services.commands import CommandResult
from runs.services.core import lock_run
from runs.services.creation import RunSpec
from runs.transitions import Status


def run_schedule(*, run_id: UUID | str, actor: User, priority: int, start_after: datetime | None) -> CommandResult:
    """Give the queued run `priority` and `start_after` (None: due now). A priority above
    PRIORITY_MAX needs the actor's `runs.prioritize_run`; a start_after at or past the run's
    deadline is refused (400), as at create. Only a queued run can be scheduled: any other is a 409
    with the run. Workers are woken at commit: one may sleep until an earlier time."""
    with transaction.atomic(durable=True):
        run = lock_run(run_id)
        spec = replace(RunSpec(agent=run.agent, input={}), priority=priority, start_after=start_after)
        spec.check_schedule(deadline=run.deadline)
        spec.check_owner(actor)
        if run.status != Status.QUEUED:
            raise RunConflict(f"only a queued run can be scheduled; this one is {run.status}", run=run)
        if (run.priority, run.start_after) == (priority, start_after):
            return CommandResult(run=run, changed=False)
        now = timezone.now()
        was_due = run.start_after is None or run.start_after <= now
        if start_after is not None and start_after > now:
            # It leaves the line until its time, and enters it then, as a run made scheduled does.
            run.turn_at = run.queued_at = start_after
        elif not was_due:
            run.turn_at = run.queued_at = now
        run.priority, run.start_after, run.updated_at = priority, start_after, now
        run.save(update_fields=["priority", "start_after", "turn_at", "queued_at", "updated_at"])
        notify.send(notify.run_queued(run.id))
    return CommandResult(run=run, changed=True)
