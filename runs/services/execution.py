"""The writes of a worker's attempt: claim, append, count steps, spawn children, heartbeat, park,
complete, fail, requeue, release (docs/design/execution.md#attempts).

Every write but the claim and the heartbeat is fenced: it locks the run and checks that the
attempt is still the run's current one (`lock_current`), so a stale attempt's late results are
dropped, never committed.
"""

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, TypeVar
from uuid import UUID

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from runs import notify
from runs.conf import conf
from runs.events import LIFECYCLE_TYPES, EventType, RequeueCause, WaitReason, usage_problem
from runs.exceptions import BudgetExhausted, StaleAttempt, ValidationFailed
from runs.metrics import series
from runs.models import AttemptOutcome, Run, RunAttempt, RunEvent
from runs.selectors.clock import db_now
from runs.services.core import (
    APPENDED,
    SYSTEM,
    add_usage,
    append,
    close_attempt,
    end,
    event_rows,
    events_note,
    lock_current,
    lock_run,
    park,
    requeue,
    require_transition,
    stop_over_budget,
)
from runs.services.creation import RunSpec, insert_run
from runs.services.quotas import pick_queued, rank_ahead
from runs.services.statements import holding, insert, inserted, send_last, update
from runs.transitions import FailCode, Status

E = TypeVar("E", bound=StrEnum)


def _known(vocabulary: type[E], value: str, what: str) -> E:
    try:
        return vocabulary(value)
    except ValueError as exc:
        raise ValidationFailed(f"unknown {what} {value!r}") from exc


def run_claim(
    *, worker: str, machine: str = "", newcomer: bool = False, expect_run: bool = True
) -> tuple[Run, RunAttempt] | None:
    """Take the queued run fair share says is next (`quotas.pick_queued`) and open its next attempt.
    `machine` says where the worker runs (`runs.worker.orphans.machine`); `newcomer` takes only a
    run of an owner with no run running (a worker's kept slot). `expect_run`: the caller was told of
    a run to take (a create's notification): the ranking is read with the pick, in the lock's round
    trip; otherwise first, alone, which is all a claim that finds nothing sends (`quotas.rank_ahead`).

    A run past its deadline is left for the sweeper to stop, never started. The claim is the start:
    the run becomes running, its attempt opens and `run.started` is written in the one transaction:
    its lock goes with its BEGIN, its writes with its COMMIT (docs/design/execution.md#claims)."""
    ranked = rank_ahead(newcomer=newcomer, expect_run=expect_run)
    if ranked == []:
        return None  # nothing to take, and no transaction opened for it
    with transaction.atomic(durable=True), holding():
        picked = pick_queued(newcomer=newcomer, ranked=ranked)
        if picked is None:
            return None
        # The clock as the run was locked: the attempt is claimed after whatever requeued the run.
        run, now = picked
        require_transition(run, Status.RUNNING)
        run.status = Status.RUNNING
        run.generation += 1
        run.started_at = run.started_at or now
        run.updated_at = now
        attempt = RunAttempt(
            run=run,
            generation=run.generation,
            worker=worker,
            machine=machine,
            claimed_at=now,
            heartbeat_at=now,
            lease_expires_at=now + timedelta(seconds=conf.LEASE_SECONDS),
        )
        started = {"generation": run.generation, "worker": worker}
        rows = event_rows(run, [(EventType.RUN_STARTED, started)], attempt=run.generation, now=now)
        # turn_at: the turn it took (quotas._take_turn), kept should it come back to the queue.
        changed = ["status", "generation", "started_at", "updated_at", "turn_at", *APPENDED]
        note = notify.statement(events_note(run, rows))
        send_last(
            insert([attempt], returning=True),
            insert(rows),
            *([note] if note else []),
            update(run, changed),
            then=lambda found: inserted([attempt], found[0]),
        )
    series.events_appended(len(rows))
    return run, attempt


def run_events_append(
    *,
    run_id: UUID | str,
    generation: int,
    events: Sequence[tuple[str, dict[str, Any]]],
    after_seq: int | None = None,
) -> list[RunEvent]:
    """Append the current attempt's events, counted against the run's `max_events` budget.

    `after_seq` is the run's last seq as the attempt knows it. While an attempt is current only it
    appends, so a different `last_seq` means an earlier try of this very append committed (its
    connection dropped before the answer came back): the stored events are returned and nothing is
    written twice. Without it, a retried append could store its events twice.

    An append that exceeds `max_events` stores the events that fit, stops the run with
    `budget_exhausted` in the same transaction, and then raises `StaleAttempt`: the attempt must
    stop. A stale attempt (older generation, run no longer running) raises it and writes nothing.
    """
    for type_, data in events:
        if type_ in LIFECYCLE_TYPES or not type_:
            raise ValidationFailed(f"an agent cannot append {type_!r} events")
        if not isinstance(data, dict):
            raise ValidationFailed("event data must be a JSON object")
        if type_ in (EventType.TOOL_STARTED, EventType.TOOL_FINISHED) and not isinstance(data.get("call_id"), str):
            # The run's end seals open calls by it (`core.end`).
            raise ValidationFailed(f"{type_} events need a call_id")
        # Summed into the run (`core.add_usage`): numbers only.
        problem = usage_problem(data) if type_ == EventType.USAGE_REPORTED else None
        if problem is not None:
            raise ValidationFailed(problem)
    if not events:
        return []
    exhausted: StaleAttempt | None = None
    with transaction.atomic(durable=True):
        run = lock_current(run_id, generation)
        if after_seq is not None and run.last_seq != after_seq:
            return _append_replayed(run, generation=generation, events=events, after_seq=after_seq)
        now = timezone.now()
        room = len(events) if run.max_events is None else max(0, run.max_events - run.events_used)
        rows = append(run, events[:room], attempt=generation, now=now) if room else []
        run.events_used += len(rows)
        run.updated_at = now
        run.save(update_fields=[*APPENDED, "events_used", "updated_at", "open_tool_calls", "reported_usage"])
        if room < len(events):
            exhausted = _exhaust(run, "max_events", now=now)
    if exhausted is not None:
        raise exhausted
    return rows


def _json(value: Any) -> Any:
    """`value` as it reads back from a JSON column (tuples become lists, and so on)."""
    return json.loads(json.dumps(value))


def _append_replayed(
    run: Run, *, generation: int, events: Sequence[tuple[str, dict[str, Any]]], after_seq: int
) -> list[RunEvent]:
    stored = list(RunEvent.objects.filter(run=run, seq__gt=after_seq).order_by("seq"))
    if [(e.type, e.data, e.attempt) for e in stored] == [(t, _json(d), generation) for t, d in events]:
        return stored
    raise _unexpected_seq(run, generation=generation, after_seq=after_seq)


def _unexpected_seq(run: Run, *, generation: int, after_seq: int) -> StaleAttempt:
    return StaleAttempt(
        f"attempt {generation} of run {run.pk} expected last seq {after_seq}, the run has {run.last_seq}", run=run
    )


def _exhaust(run: Run, budget: str, *, now: datetime) -> StaleAttempt:
    """Stop the locked run whose `budget` an attempt's write would exceed; the error to raise
    once the transaction has committed."""
    stop_over_budget(run, budget, now=now)
    return StaleAttempt(f"run {run.pk} stopped: {run.end_reason}", run=run)


def run_steps_record(*, run_id: UUID | str, generation: int, steps: int, after_steps: int | None = None) -> Run:
    """Count `steps` agent steps (model turns, tool calls) of the current attempt against the run's
    `max_steps` budget, which spans attempts. Fenced like an append.

    `after_steps` is `steps_used` as the attempt knows it: a retry of a record that committed
    counts nothing twice. Steps beyond the budget are not counted; the run is stopped with
    `budget_exhausted` and `StaleAttempt` raised once that has committed.
    """
    if steps < 1:
        raise ValidationFailed("steps must be at least 1")
    exhausted: StaleAttempt | None = None
    with transaction.atomic(durable=True):
        run = lock_current(run_id, generation)
        if after_steps is not None and run.steps_used != after_steps:
            if run.steps_used == after_steps + steps:
                return run  # an earlier try of this record committed
            raise StaleAttempt(
                f"attempt {generation} of run {run_id} expected {after_steps} steps used, the run has {run.steps_used}",
                run=run,
            )
        now = timezone.now()
        room = steps if run.max_steps is None else max(0, run.max_steps - run.steps_used)
        run.steps_used += min(steps, room)
        run.updated_at = now
        run.save(update_fields=["steps_used", "updated_at"])
        if room < steps:
            exhausted = _exhaust(run, "max_steps", now=now)
    if exhausted is not None:
        raise exhausted
    return run


def run_child_spawn(
    *,
    run_id: UUID | str,
    generation: int,
    input: dict[str, Any],
    agent: str | None = None,
    metadata: dict[str, str] | None = None,
    after_seq: int | None = None,
) -> Run:
    """The current attempt of a run creates a child run (of its own agent unless told, with the
    parent's metadata unless given), owned by the parent's owner. The parent's `EventType.CHILD_SPAWNED` event is written in the same transaction, so
    a later attempt finds the child in its stored events and never spawns it twice.

    The event counts against the parent's `max_events`: past it the parent is stopped
    (`budget_exhausted`), no child is made, and `StaleAttempt` is raised. `after_seq` makes a retry
    safe as in `run_events_append`: it returns the child an earlier try committed."""
    if not isinstance(input, dict):
        raise ValidationFailed("input must be a JSON object", detail={"input": ["must be a JSON object"]})
    exhausted: StaleAttempt | None = None
    with transaction.atomic(durable=True):
        # Locks the parent first (ancestor before descendant, as everywhere) and fences the
        # attempt: a child is never created under a terminal parent or by a stale attempt.
        parent = lock_current(run_id, generation)
        if after_seq is not None and parent.last_seq != after_seq:
            return _spawn_replayed(parent, generation=generation, after_seq=after_seq)
        # A child shares its parent's urgency (the parent waits for it) and, unless given, its labels.
        spec = RunSpec(
            agent=agent or parent.agent,
            input=input,
            parent_id=parent.pk,
            metadata=parent.metadata if metadata is None else metadata,
            priority=parent.priority,
        )
        spec.check()
        now = timezone.now()
        if parent.max_events is not None and parent.events_used >= parent.max_events:
            exhausted = _exhaust(parent, "max_events", now=now)
        else:
            child = insert_run(spec, owner=parent.owner, now=now, parent_locked=True, capped=False)
            spawned = {"run_id": str(child.pk), "agent": spec.agent}
            append(parent, [(EventType.CHILD_SPAWNED, spawned)], attempt=generation, now=now)
            parent.events_used += 1
            parent.updated_at = now
            parent.save(update_fields=[*APPENDED, "events_used", "updated_at"])
    if exhausted is not None:
        raise exhausted
    return child


def _spawn_replayed(parent: Run, *, generation: int, after_seq: int) -> Run:
    last = RunEvent.objects.filter(run=parent, seq=after_seq + 1).first()
    if (
        parent.last_seq == after_seq + 1
        and last is not None
        and (last.type, last.attempt) == (EventType.CHILD_SPAWNED, generation)
    ):
        return Run.objects.get(pk=last.data["run_id"])
    raise _unexpected_seq(parent, generation=generation, after_seq=after_seq)


def run_attempt_heartbeat(*, run_id: UUID | str, generation: int) -> bool:
    """Renew the lease of a still-open attempt. False means the attempt is no longer the run's:
    the worker must stop executing it."""
    now = db_now()
    renewed = RunAttempt.objects.filter(run_id=run_id, generation=generation, outcome=AttemptOutcome.RUNNING).update(
        heartbeat_at=now, lease_expires_at=now + timedelta(seconds=conf.LEASE_SECONDS)
    )
    return renewed == 1


def run_attempt_group_record(*, run_id: UUID | str, generation: int, group: Sequence[int]) -> None:
    """Record a process group one of the attempt's tools runs in, `[pgid, the leader's start time
    in clock ticks]`, so that a worker on the attempt's machine can kill what is left of it should
    the attempt's worker die (`runs.worker.orphans`).

    Not fenced: a stale attempt's tool is a process all the same."""
    pgid, ticks = (int(n) for n in group)
    with transaction.atomic(durable=True):
        # The attempt's row alone, locked: two tools started at once must both be added.
        attempt = RunAttempt.objects.select_for_update(no_key=True).get(run_id=run_id, generation=generation)
        attempt.process_groups = [*attempt.process_groups, [pgid, ticks]]
        attempt.save(update_fields=["process_groups"])


def run_attempt_release(
    *,
    run_id: UUID | str,
    generation: int,
    outcome: AttemptOutcome | None = None,
    released_at: datetime | None = None,
    usage: dict[str, Any] | None = None,
) -> None:
    """Record that the worker has stopped executing the attempt (the run may have ended before).

    `released_at` is when it stopped, if that was before this call (a worker that stopped while
    the database was unreachable records it once it is back). Idempotent: a release is recorded once
    (only made more precise for a lost attempt).

    `usage` is what the agent reported it used as the run was cancelled or stopped under it
    (`AgentContext.report_usage_at_stop`): added to the run's `reported_usage` with the release's
    first record, so a retried release adds it once.
    """
    if usage:
        problem = usage_problem(usage)
        if problem is not None:
            raise ValidationFailed(problem)
        with transaction.atomic(durable=True):
            # The run's lock first, as every write takes them (run, then its attempt).
            run = lock_run(run_id)
            unreleased = RunAttempt.objects.filter(run_id=run_id, generation=generation, released_at__isnull=True)
            if unreleased.exists():
                add_usage(run, usage)
                run.save(update_fields=["reported_usage"])
            _release(run_id=run_id, generation=generation, outcome=outcome, released_at=released_at)
        return
    _release(run_id=run_id, generation=generation, outcome=outcome, released_at=released_at)


def _release(
    *, run_id: UUID | str, generation: int, outcome: AttemptOutcome | None, released_at: datetime | None
) -> None:
    released_at = released_at or timezone.now()
    # Read first, for runledger_cancel_release_seconds: when its run was cancelled or stopped
    # under it (once per attempt, never on the append path).
    ended_at = (
        RunAttempt.objects.filter(
            run_id=run_id,
            generation=generation,
            released_at__isnull=True,
            outcome__in=[AttemptOutcome.CANCELLED, AttemptOutcome.STOPPED],
        )
        .values_list("run__ended_at", flat=True)
        .first()
    )
    changes: dict[str, Any] = {"released_at": released_at}
    # A lost attempt was released by the sweeper as of its lease's lapse, the latest it can have
    # stopped; its worker, back in touch, knows the very moment.
    unknown = Q(released_at__isnull=True) | Q(outcome=AttemptOutcome.LOST, released_at__gt=released_at)
    qs = RunAttempt.objects.filter(unknown, run_id=run_id, generation=generation)
    if outcome is not None:
        # Only an attempt nobody closed yet takes the worker's outcome (e.g. abandoned).
        qs.filter(outcome=AttemptOutcome.RUNNING).update(outcome=outcome, **changes)
    if qs.update(**changes) and ended_at is not None:
        series.cancel_released(ended_at=ended_at, released_at=released_at)


def run_wait(*, run_id: UUID | str, generation: int, reason: str, prompt: str | None = None) -> Run:
    """The worker parks the run at a safe boundary and releases it; a resume ticket is issued."""
    why = _known(WaitReason, reason, "wait reason")
    exhausted: StaleAttempt | None = None
    with transaction.atomic(durable=True):
        run = lock_current(run_id, generation, ending=True)
        now = timezone.now()
        try:
            park(run, why, prompt=prompt, attempt=generation, now=now)
        except BudgetExhausted:
            # The wait's events would pass max_events: the run stops, as at any write past it.
            exhausted = _exhaust(run, "max_events", now=now)
        else:
            close_attempt(run, AttemptOutcome.WAITING, now=now, released=True)
    if exhausted is not None:
        raise exhausted
    return run


def run_complete(*, run_id: UUID | str, generation: int, output: Any) -> Run:
    with transaction.atomic(durable=True):
        run = lock_current(run_id, generation, ending=True)
        end(run, Status.COMPLETED, code="", reason="", by=SYSTEM, now=timezone.now(), attempt=generation, output=output)
    return run


def run_fail(*, run_id: UUID | str, generation: int, code: FailCode, reason: str, error: Any = None) -> Run:
    with transaction.atomic(durable=True):
        run = lock_current(run_id, generation, ending=True)
        end(
            run, Status.FAILED, code=code, reason=reason, by=SYSTEM, now=timezone.now(), attempt=generation, error=error
        )
    return run


def run_requeue(*, run_id: UUID | str, generation: int, cause: str) -> Run:
    """End an attempt that did not finish: a clean shutdown (`worker_shutdown`, not counted) or a
    lost lease (`lease_expired`, counted against `max_attempts`; past it the run fails)."""
    why = _known(RequeueCause, cause, "requeue cause")
    with transaction.atomic(durable=True):
        run = lock_current(run_id, generation)
        requeue(run, cause=why, now=timezone.now())
    return run
