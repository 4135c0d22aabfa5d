"""Cancel or stop every run that matches a filter (docs/design/commands.md#bulk-commands): the single
command once per run, each in its own transaction under its own row lock, checked there by the
single command's rule and the filter's statuses; no transaction around the whole, and no lock held
on one run while another is taken. The runs are those matched when the command starts
(`runs.selectors.run_list`, the caller's visibility applied)."""

import enum
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from uuid import UUID

from django.db import transaction
from django.db.models import QuerySet

from runs import access
from runs.access import User
from runs.exceptions import NotFound, PermissionDenied, RunConflict, TooManyMatches
from runs.models import Run
from runs.services.commands import CommandResult, cancel_locked, stop_locked
from runs.services.core import lock_run
from runs.transitions import TERMINAL, Status, StopCode

# Each run is a transaction of its own inside one request: past this, narrow the filter. The
# console's bulk actions share the bound.
MAX_BULK_RUNS = 1000


class Outcome(enum.StrEnum):
    """What a bulk command did to one run; `DONE` is spelled as its command's past tense."""

    DONE = "done"
    # It had ended (completed, failed, cancelled or stopped) before this command locked it.
    ALREADY_ENDED = "already_ended"
    # Still live, but its status is no longer one the filter asks for.
    NO_LONGER_MATCHING = "no_longer_matching"
    # The caller sees it but may not send it this command (`runs.access`).
    FORBIDDEN = "forbidden"
    # Deleted (by retention) between the match and its lock.
    GONE = "gone"


@dataclass(frozen=True)
class BulkResult:
    # The past tense of the command: "cancelled" or "stopped", `Outcome.DONE`'s name in answers.
    done: str
    matched: int
    ids: dict[Outcome, list[UUID]] = field(default_factory=dict)

    def by_name(self) -> dict[str, list[UUID]]:
        """Every outcome (empty ones too, so that a client can rely on the keys), by its name."""
        return {self.done if o is Outcome.DONE else o.value: self.ids.get(o, []) for o in Outcome}


@dataclass(frozen=True)
class _Command:
    # Its past tense, `Outcome.DONE`'s name in answers.
    done: str
    # Who may send it to a run: the single command's rule.
    rule: access.Rule
    # The single command's write, on the locked run.
    write: Callable[[Run], CommandResult]


def runs_cancel_matching(
    *, runs: QuerySet[Run], actor: User, max_runs: int, statuses: Collection[str] = (), note: str = ""
) -> BulkResult:
    """Cancel each of `runs` (the caller's matches, visibility applied) that `actor` may cancel,
    as `run_cancel` does; nothing if more than `max_runs` match (TooManyMatches). `statuses` is
    the filter's, re-checked under each run's lock."""
    command = _Command(Status.CANCELLED.value, access.CANCEL, lambda run: cancel_locked(run, actor=actor, note=note))
    return _each(runs, actor, max_runs, statuses, command)


def runs_stop_matching(
    *,
    runs: QuerySet[Run],
    actor: User,
    max_runs: int,
    reason: str,
    code: str = StopCode.STAFF,
    statuses: Collection[str] = (),
) -> BulkResult:
    """`runs_cancel_matching`, stopping with `code` and `reason` as `run_stop` does."""
    command = _Command(
        Status.STOPPED.value, access.STOP, lambda run: stop_locked(run, actor=actor, code=code, reason=reason)
    )
    return _each(runs, actor, max_runs, statuses, command)


def _each(runs: QuerySet[Run], actor: User, max_runs: int, statuses: Collection[str], command: _Command) -> BulkResult:
    # One more than allowed is enough to refuse; the count is only made for the refusal.
    ids = list(runs.values_list("pk", flat=True)[: max_runs + 1])
    if len(ids) > max_runs:
        count = runs.count()
        raise TooManyMatches(
            f"{count} runs match, more than max ({max_runs}): nothing was done",
            detail={"count": count, "max": max_runs},
        )
    result = BulkResult(done=command.done, matched=len(ids))
    for run_id in ids:
        result.ids.setdefault(_one(run_id, actor, frozenset(statuses), command), []).append(run_id)
    return result


def _one(run_id: UUID, actor: User, wanted: frozenset[str], command: _Command) -> Outcome:
    try:
        with transaction.atomic(durable=True):
            run = lock_run(run_id, ending=True)
            # The single command's checks, on the row it locks. A run that ended meanwhile goes on
            # to the command, which reports it and writes nothing (or refuses it: a conflict).
            access.require(actor, run, command.rule, run_id=run_id)
            if wanted and run.status not in wanted and run.status not in _TERMINAL:
                return Outcome.NO_LONGER_MATCHING
            changed = command.write(run).changed
    except NotFound:
        return Outcome.GONE
    except PermissionDenied:
        return Outcome.FORBIDDEN
    except RunConflict:
        return Outcome.ALREADY_ENDED
    # Not changed: it was already cancelled (or stopped): ended before, like any other.
    return Outcome.DONE if changed else Outcome.ALREADY_ENDED


_TERMINAL = frozenset(status.value for status in TERMINAL)
