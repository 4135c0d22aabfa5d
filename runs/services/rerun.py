"""Running an ended run again, and forking it from the middle of its log
(docs/design/commands.md#rerun).

One transaction: lock the original (so that it cannot be purged or change meanwhile), check it has
ended, read the events the fork copies, and insert the new run with its `run.created` and the
copies — gap-free seqs from 1, under no lock of the new run, which no one else can see yet.
"""

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import transaction

from runs import access
from runs.access import User
from runs.agents import declared_types
from runs.conf import conf
from runs.events import FORKED_FROM_SEQ, RESUMED_TICKET, EventType, forkable_types
from runs.exceptions import InvalidTransition, ValidationFailed
from runs.models import PRIORITY_MAX, Run, RunEvent
from runs.services.commands import lock_for
from runs.services.creation import Rerun, RunSpec, insert_run


@dataclass(frozen=True)
class Overrides:
    """What a rerun's caller changes; None keeps the original's — but for `deadline`, an absolute
    time the original's may already have passed: None gives the default deadline of a create."""

    agent: str | None = None
    input: dict[str, Any] | None = None
    max_steps: int | None = None
    max_events: int | None = None
    max_attempts: int | None = None
    deadline: datetime | None = None
    metadata: dict[str, str] | None = None


def run_rerun(
    *,
    run_id: UUID | str,
    owner: User,
    from_seq: int | None = None,
    overrides: Overrides = Overrides(),
    caller: User | None = None,
) -> Run:
    """Run the ended run `run_id` again: a new run, queued and committed, of its agent, input,
    budgets and metadata (each as `overrides` says), owned by `owner`, its `rerun_of` the original
    (docs/design/commands.md#rerun); with `from_seq`, a fork whose log starts with a copy of the
    original's agent events up to that seq (docs/design/commands.md#fork). Returns the new run.

    Raises `NotFound` for no such run, `InvalidTransition` for one not ended, `ValidationFailed` for
    a `from_seq` past its log or inside a tool call, and what `run_create` raises. Who may rerun it
    is the caller's to check (`runs.access.can_rerun`). `caller`, internal: the API's
    user, checked on the locked run."""
    if from_seq is not None and from_seq < 1:
        raise ValidationFailed("from_seq must be at least 1", detail={"from_seq": ["must be at least 1"]})
    with transaction.atomic(durable=True):
        # FOR NO KEY UPDATE, like every command: the original stays as it is (and is not purged)
        # until the copy is committed.
        original = lock_for(run_id, caller, access.RERUN)
        spec = _spec(original, overrides, owner)
        # Even the original's own: a fork has no agent to choose (docs/design/commands.md#fork).
        if from_seq is not None and overrides.agent is not None:
            message = "a fork continues the original's agent; leave agent out, or rerun without from_seq"
            raise ValidationFailed(message, detail={"agent": [message]})
        spec.check()
        if not original.is_terminal:
            raise InvalidTransition(original.status, "rerun", run=original)
        copies = [] if from_seq is None else _copies(original, from_seq)
        # The copies count against the fork's max_events (docs/design/commands.md#fork): a fork with
        # no room for them is bad input, refused before anything is written.
        max_events = spec.max_events if spec.max_events is not None else conf.DEFAULT_MAX_EVENTS
        if max_events is not None and len(copies) > max_events:
            message = f"the fork copies {len(copies)} events, more than its max_events of {max_events}"
            raise ValidationFailed(message, detail={"from_seq": [message]})
        return insert_run(spec, owner=owner, rerun=Rerun(of=original.pk, from_seq=from_seq, copies=copies))


def _spec(original: Run, overrides: Overrides, owner: User) -> RunSpec:
    def given(name: str) -> Any:
        value = getattr(overrides, name)
        return value if value is not None else getattr(original, name)

    # A rerun is a run of its own, not another child of the original's parent (which has ended, or
    # would end it): `rerun_of` is its link.
    return RunSpec(
        agent=given("agent"),
        input=given("input"),
        max_steps=given("max_steps"),
        max_events=given("max_events"),
        max_attempts=given("max_attempts"),
        deadline=overrides.deadline,
        metadata=given("metadata"),
        # Its rank among the owner's runs; a start time, like a deadline, is not copied.
        priority=_priority(original.priority, owner),
    )


def _priority(priority: int, owner: User) -> int:
    """The original's priority as far as the new run's owner may give it: above PRIORITY_MAX jumps
    fair share, which only runs.prioritize_run grants (docs/design/fair-use.md#priority), so a
    caller without it reruns at PRIORITY_MAX, the highest they may give themselves."""
    if priority > PRIORITY_MAX and not owner.has_perm("runs.prioritize_run"):
        return PRIORITY_MAX
    return priority


def _copies(original: Run, from_seq: int) -> list[tuple[str, dict[str, Any]]]:
    """The original's agent events, waits and resumes among 1..`from_seq`, each with its original
    seq in its data; refused when `from_seq` passes the log's end or cuts a tool call (its
    `tool.started` copied, its `tool.finished` not: the fork's agent would be told of a call no
    attempt of its own holds). A wait not answered by then is left out: the fork asks again."""
    if from_seq > original.last_seq:
        message = f"from_seq {from_seq} passes the end of run {original.pk}'s log (last seq {original.last_seq})"
        raise ValidationFailed(message, detail={"from_seq": [message]})
    types = forkable_types(declared_types(original.agent))
    events = RunEvent.objects.filter(run=original, seq__lte=from_seq, type__in=sorted(types)).order_by("seq")
    copies = []
    open_calls: dict[str, int] = {}
    for seq, type_, data in events.values_list("seq", "type", "data"):
        if type_ == EventType.TOOL_STARTED:
            open_calls[data["call_id"]] = seq
        elif type_ == EventType.TOOL_FINISHED:
            open_calls.pop(data["call_id"], None)
        elif type_ == EventType.RUN_RESUMED:
            data = {key: value for key, value in data.items() if key != RESUMED_TICKET}
        copies.append((type_, {**data, FORKED_FROM_SEQ: seq}))
    if copies and copies[-1][0] == EventType.RUN_WAITING:
        copies.pop()
    if open_calls:
        call_id, started = next(iter(open_calls.items()))
        message = (
            f"from_seq {from_seq} cuts tool call {call_id!r} (started at seq {started}, not finished by then); "
            "fork before it starts or after it finishes"
        )
        raise ValidationFailed(message, detail={"from_seq": [message]})
    return copies
