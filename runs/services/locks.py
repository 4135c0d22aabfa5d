"""Locking a run for a command (docs/design/commands.md#one-transaction): the run's row, its owner
with it, and for a command that ends or parks it what else its end must write (`Around`), in one
round trip."""

from dataclasses import dataclass
from typing import Any, cast
from uuid import UUID

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import connection
from django.db.models import Field, Model

from runs.exceptions import NotFound, StaleAttempt
from runs.models import TERMINAL_VALUES, Run, WebhookEndpoint
from runs.services.statements import columns, from_row, send_prepared
from runs.transitions import Status


@dataclass(frozen=True)
class Around:
    """What a lock taken for an end (`lock_run(ending=True)`) saw beside the run: whether it has
    unfinished children to end with it, and whether an enabled webhook endpoint may want its events.
    Read by a statement of its own sent right after the lock's, so its snapshot is taken once the
    lock is held: a child created under the run (which locks it first) committed before, or waits
    and then finds the run ended. (In the locking statement itself, a lock waited for would leave
    the subqueries on the snapshot from before the wait, blind to that child.) A lock that did not
    look knows neither: both True, and the end reads them."""

    children: bool = True
    endpoints: bool = True


def around(run: Run) -> Around:
    return getattr(run, "_around", _UNKNOWN)


_UNKNOWN = Around()


def lock_run(run_id: UUID | str, *, ending: bool = False) -> Run:
    """The run, locked, its owner with it; with `ending`, its `Around` too, in the same round trip."""
    # FOR NO KEY UPDATE: event and child inserts take FOR KEY SHARE on the run through their
    # foreign key, and must not wait for this lock. (SQLite has none: its IMMEDIATE transactions
    # serialise the writers instead.) The owner comes with it, locked no further: every answer
    # names them. Written plainly, not through the ORM: the statement is the same every time, and
    # goes prepared (runs.prepared).
    pk = Run._meta.pk
    assert pk is not None
    try:
        key = pk.get_db_prep_value(pk.to_python(run_id), connection)
    except (ValueError, DjangoValidationError) as exc:
        raise NotFound(f"run {run_id} not found") from exc
    sql = _LOCK_SQL.format(runs=columns(Run, "r"), owners=columns(_OWNER, "u"))
    statements = [(sql + _LOCK_CLAUSE[connection.vendor == "postgresql"], [key])]
    if ending:
        statements.append((_AROUND_SQL, [key, *TERMINAL_VALUES, key]))
    found = send_prepared(*statements)
    if not found[0]:
        raise NotFound(f"run {run_id} not found")
    row = found[0][0]
    split = len(Run._meta.concrete_fields)
    run = from_row(Run, row[:split])
    Run.owner.field.set_cached_value(run, from_row(_OWNER, row[split:]))
    if ending:
        children, endpoints = found[1][0]
        run._around = Around(children=bool(children), endpoints=bool(endpoints))  # type: ignore[attr-defined]
    return run


_OWNER = cast(type[Model], Run._meta.get_field("owner").related_model)
_OWNER_KEY = cast("Field[Any, Any]", _OWNER._meta.pk).column
_LOCK_SQL = (
    f"SELECT {{runs}}, {{owners}} FROM {Run._meta.db_table} r"
    f" INNER JOIN {_OWNER._meta.db_table} u ON u.{_OWNER_KEY} = r.owner_id WHERE r.id = %s"
)
_LOCK_CLAUSE = {True: " FOR NO KEY UPDATE OF r", False: ""}
_AROUND_SQL = f"""SELECT
    EXISTS (SELECT 1 FROM {Run._meta.db_table} WHERE parent_id = %s
            AND status NOT IN ({", ".join(["%s"] * len(TERMINAL_VALUES))})),
    EXISTS (SELECT 1 FROM {WebhookEndpoint._meta.db_table} WHERE enabled
            AND owner_id = (SELECT owner_id FROM {Run._meta.db_table} WHERE id = %s))
    OR EXISTS (SELECT 1 FROM {WebhookEndpoint._meta.db_table} WHERE enabled AND all_runs)"""


def lock_current(run_id: UUID | str, generation: int, *, ending: bool = False) -> Run:
    """Lock the run and fence the caller: only its current, running attempt may write. `ending`:
    as `lock_run`'s, for a caller that ends or parks the run."""
    run = lock_run(run_id, ending=ending)
    if run.status != Status.RUNNING or run.generation != generation:
        raise StaleAttempt(
            f"attempt {generation} of run {run_id} is no longer current (run is {run.status}, "
            f"attempt {run.generation})",
            run=run,
        )
    return run


def lock_or_skip(run_id: UUID | str) -> Run | None:
    """Lock the run unless another transaction holds it (another sweeper, or a command that will
    leave it changed): then None, and the next sweep looks again."""
    return Run.objects.select_for_update(no_key=True, skip_locked=True).filter(pk=run_id).first()
