"""Creating runs (docs/design/api.md#create): what a new run is made of (`RunSpec`), its checks, and its insert."""

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.db import connection, transaction
from django.utils import timezone

from runs import notify
from runs.access import User
from runs.agents import input_problems, is_registered, registered_names
from runs.conf import conf
from runs.events import EventType
from runs.exceptions import InvalidTransition, ValidationFailed
from runs.metadata import check_metadata
from runs.metrics import series
from runs.models import PRIORITY_MAX, PRIORITY_MIN, URGENT_MAX, Run
from runs.services.core import event_rows, events_note, lock_run
from runs.services.quotas import check_create
from runs.services.statements import holding, insert, send_last
from runs.storable import json_bytes, value_problem


@dataclass(frozen=True)
class RunSpec:
    """Everything a caller chooses about a new run (docs/design/api.md#create)."""

    agent: str
    input: dict[str, Any]
    parent_id: UUID | str | None = None
    max_steps: int | None = None
    max_events: int | None = None
    max_attempts: int | None = None
    deadline: datetime | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    priority: int = 0
    start_after: datetime | None = None

    def check(self) -> None:
        """Refuse what no run may be made of, before any transaction starts."""
        if not is_registered(self.agent):
            known = ", ".join(registered_names()) or "none"
            message = f"unknown agent {self.agent!r}; registered agents: {known}"
            raise ValidationFailed(message, detail={"agent": [message]})
        if not isinstance(self.input, dict):
            raise ValidationFailed("input must be a JSON object", detail={"input": ["must be a JSON object"]})
        check_input(self.agent, self.input)
        check_metadata(self.metadata)
        for name in ("max_steps", "max_events", "max_attempts"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValidationFailed(f"{name} must be at least 1", detail={name: ["must be at least 1"]})
        self.check_schedule(deadline=self.deadline)

    def check_schedule(self, *, deadline: datetime | None) -> None:
        """Refuse a priority out of every bound, and a start time at or past the run's deadline."""
        if not PRIORITY_MIN <= self.priority <= URGENT_MAX:
            problem = f"must be between {PRIORITY_MIN} and {PRIORITY_MAX} (up to {URGENT_MAX} with runs.prioritize_run)"
            raise ValidationFailed(f"priority {problem}", detail={"priority": [problem]})
        if self.start_after is not None and deadline is not None and deadline <= self.start_after:
            problem = "must be before the deadline: the run would pass it before it may start"
            raise ValidationFailed(f"start_after {problem}", detail={"start_after": [problem]})

    def check_owner(self, owner: User) -> None:
        """Refuse a priority that jumps fair share (docs/design/fair-use.md#priority) to an owner
        without `runs.prioritize_run`. Asked only then, so a create reads no permissions."""
        if self.priority > PRIORITY_MAX and not owner.has_perm("runs.prioritize_run"):
            problem = f"above {PRIORITY_MAX} needs the runs.prioritize_run permission"
            raise ValidationFailed(f"priority {problem}", detail={"priority": [problem]})


def check_input(agent: str, input: Any) -> None:
    """Refuse `input` for a run of `agent` — a new run's, or a resume's (which may be any JSON value):
    what cannot be stored and read back as the JSON it is, or is larger than a request body may be
    (runs.storable), and for an object, what the agent's own check finds wrong with it."""
    problem = value_problem(input, max_bytes=conf.MAX_BODY_BYTES)
    if problem is not None:
        raise ValidationFailed(f"input cannot be stored: {problem}", detail={"input": [problem]})
    problems = input_problems(agent, input) if isinstance(input, dict) else {}
    if problems:
        said = "; ".join(f"{key} {problem}" for key, problem in sorted(problems.items()))
        detail = {"input": {key: [problem] for key, problem in sorted(problems.items())}}
        raise ValidationFailed(f"input of agent {agent!r}: {said}", detail=detail)


def run_create(
    *,
    owner: User,
    agent: str,
    input: dict[str, Any],
    parent_id: UUID | str | None = None,
    max_steps: int | None = None,
    max_events: int | None = None,
    max_attempts: int | None = None,
    deadline: datetime | None = None,
    metadata: dict[str, str] | None = None,
    priority: int = 0,
    start_after: datetime | None = None,
) -> Run:
    """Create a run of `agent` for `owner`, queued with its `run.created` event, and return it. It
    commits before it returns (so call it outside any transaction), and a worker may claim it at once.

    `input` is the agent's input, a JSON object its own check accepts. `parent_id` makes it a child
    of that unfinished run, which ends it when it ends. `max_steps`, `max_events`, `max_attempts`
    and `deadline` are its budgets (None: the settings' defaults); `metadata` string labels that
    `run_list` filters by; `priority` its rank among the owner's queued runs, -100 to 100 (up to
    1000, ahead of fair share, for owners with `runs.prioritize_run`); `start_after` the time before
    which no worker claims it (docs/design/api.md#create).

    Raises `ValidationFailed` for anything no run may be made of (an unknown agent, input its check
    refuses), `NotFound` or `InvalidTransition` for a parent missing or ended, and `TooManyRequests`
    at one of the owner's limits (docs/design/fair-use.md). Who may create, and under which parent,
    is the caller's to decide."""
    spec = RunSpec(
        agent=agent,
        input=input,
        parent_id=parent_id,
        max_steps=max_steps,
        max_events=max_events,
        max_attempts=max_attempts,
        deadline=deadline,
        metadata={} if metadata is None else metadata,
        priority=priority,
        start_after=start_after,
    )
    spec.check()
    spec.check_owner(owner)
    with transaction.atomic(durable=True), holding():
        return insert_run(spec, owner=owner)


@dataclass(frozen=True)
class Rerun:
    """What makes a new run a rerun (docs/design/commands.md#rerun): the run it runs again and, for
    a fork, the seq it forks at and the copies of the original's events up to it, in order."""

    of: UUID
    from_seq: int | None = None
    copies: Sequence[tuple[str, dict[str, Any]]] = ()


def insert_run(
    spec: RunSpec,
    *,
    owner: User,
    now: datetime | None = None,
    parent_locked: bool = False,
    capped: bool = True,
    rerun: Rerun | None = None,
    schedule: tuple[UUID, datetime] | None = None,
) -> Run:
    """Insert the checked run of `spec`, queued, with its `run.created` event, inside the caller's
        transaction. Its parent is locked here unless the caller holds that lock already. The owner's
        caps (active runs, runs and bytes kept) apply unless `capped` is False (a child an agent spawns:
        refusing it would fail its parent mid-run; `children` is bounded by the agent's input instead,
        and the child's bytes count all the same). A fork's copies follow `run.created`, counted in the
        bytes the caps see and in `events_used`. `schedule`: the schedule that fires it and the due time
    it fires for (docs/design/schedules.md#firing)."""
    input_bytes = json_bytes(spec.input)
    # The labels are stored too, and count as the input does (at most ~27 kB: runs.metadata).
    metadata_bytes = json_bytes(spec.metadata) if spec.metadata else 0
    copies = list(rerun.copies) if rerun is not None else []
    if capped:
        copied_bytes = sum(json_bytes(data) for _, data in copies)
        check_create(owner.pk, input_bytes=input_bytes + metadata_bytes + copied_bytes)
    if spec.parent_id is not None and not parent_locked:
        # Locking the parent serialises this insert against the parent ending, so a child
        # is never created under a terminal parent.
        parent = lock_run(spec.parent_id)
        if parent.is_terminal:
            raise InvalidTransition(parent.status, "a parent of a new run", run=parent)
    now = now or timezone.now()
    # A run scheduled ahead enters the line between owners, and the queue, when it falls due.
    due = max(now, spec.start_after) if spec.start_after is not None else now
    run = Run(
        owner=owner,  # type: ignore[misc]  # AUTH_USER_MODEL; the object, so its JSON needs no read of it
        agent=spec.agent,
        input=spec.input,
        input_bytes=input_bytes,
        metadata=spec.metadata,
        # `append` adds the bytes of `run.created` below.
        stored_bytes=input_bytes + metadata_bytes,
        parent_id=spec.parent_id,
        rerun_of_id=rerun.of if rerun is not None else None,
        schedule_id=schedule[0] if schedule is not None else None,
        schedule_due_at=schedule[1] if schedule is not None else None,
        max_steps=spec.max_steps if spec.max_steps is not None else conf.DEFAULT_MAX_STEPS,
        max_events=spec.max_events if spec.max_events is not None else conf.DEFAULT_MAX_EVENTS,
        deadline=spec.deadline or _default_deadline(due),
        priority=spec.priority,
        start_after=spec.start_after,
        turn_at=due,
        created_at=now,
        queued_at=due,
        updated_at=now,
    )
    if spec.max_attempts is not None:
        run.max_attempts = spec.max_attempts
    created: dict[str, Any] = {
        "agent": spec.agent,
        "input_keys": sorted(spec.input),
        "parent": str(spec.parent_id) if spec.parent_id else None,
    }
    if rerun is not None:
        created |= {"rerun_of": str(rerun.of), "from_seq": rerun.from_seq}
        # The copies are the run's events like any other: a fork uses its budget as the original did
        # up to the fork (docs/design/commands.md#fork).
        run.events_used = len(copies)
    # The event first, so the run is inserted with its last_seq at once (no second write of the
    # row): foreign keys are checked at commit (Django declares them DEFERRABLE INITIALLY DEFERRED).
    rows = event_rows(run, [(EventType.RUN_CREATED, created), *copies], attempt=None, now=now)
    events = events_note(run, rows)
    if due > now:
        # Nothing to claim yet: the workers only learn when it falls due, and wake then.
        noted = notify.statement(events, scheduled=(run.id, due))
    else:
        noted = notify.statement(events, notify.run_queued(run.id))
    # The events, the run and the notifications: one round trip (with the COMMIT, `holding`).
    send_last(insert(rows), insert([run]), *([noted] if noted is not None else []))
    run._state.adding, run._state.db = False, connection.alias
    series.events_appended(len(rows))
    return run


def _default_deadline(now: datetime) -> datetime | None:
    seconds = conf.DEFAULT_DEADLINE_SECONDS
    return now + timedelta(seconds=seconds) if seconds else None
