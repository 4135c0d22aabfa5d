"""The order claims serve owners in (docs/design/fair-use.md#fair-claiming), as SQL: the ranking
alone, and the ranking with the first owner's run picked and locked in the same statement
(docs/design/execution.md#claims)."""

import re
from functools import cache
from typing import Any

from django.db import connection
from django.db.models.functions import Now

from runs.models import PRIORITY_MAX
from runs.services.statements import Statement
from runs.transitions import Status

# Owners with runs queued and due, in the order claims serve them: the fewest running runs first,
# then the earliest turn (`Run.turn_at`: when their earliest such run fell due, created or reached
# its start_after). The recursive part walks the queued rows one owner at a time, and each count and
# minimum is an index lookup (`run_queued_turn`), so the cost follows the number of owners waiting,
# not the number of runs queued (each once: `counted` is materialized, or the filter on `turn`
# would look it up again). Owners at the running cap are left out. `flags` says whether any run
# that jumps fair share is queued (`run_queued_urgent`, an index almost always empty), so the
# claim looks for one only then. No owner at all: nothing is claimable, urgent or not (an urgent
# run's owner is ranked unless its runs are not due or the owner is at the cap, which rule it out
# as well).
_RANKED = """
WITH RECURSIVE owners(owner_id) AS (
    SELECT MIN(owner_id) FROM runs_run WHERE status = %(queued)s
    UNION ALL
    SELECT (SELECT MIN(q.owner_id) FROM runs_run q WHERE q.status = %(queued)s AND q.owner_id > owners.owner_id)
    FROM owners WHERE owners.owner_id IS NOT NULL
), counted AS MATERIALIZED (
    SELECT owner_id,
           (SELECT COUNT(*) FROM runs_run r WHERE r.owner_id = owners.owner_id AND r.status = %(running)s) AS running,
           (SELECT MIN(q.turn_at) FROM runs_run q WHERE q.owner_id = owners.owner_id AND q.status = %(queued)s
                AND (q.start_after IS NULL OR q.start_after <= {now})) AS turn
    FROM owners WHERE owner_id IS NOT NULL
), ranked AS (
    SELECT owner_id, running, turn FROM counted WHERE turn IS NOT NULL AND (%(cap)s = 0 OR running < %(cap)s)
), flags AS (
    SELECT EXISTS (SELECT 1 FROM runs_run u WHERE u.status = %(queued)s AND u.priority > %(urgent)s) AS urgent
)"""
# Its rows: (owner_id, turn, urgent), in claim order.
_OWNERS = _RANKED + "\nSELECT owner_id, turn, urgent FROM ranked, flags ORDER BY running, turn, owner_id\n"
# The same rows, the first owner's row led by `pick`'s columns: their best claimable run, locked
# (`pick` compares the owner with FIRST_OWNER), none when an urgent run is queued (it goes first)
# or when another claim holds each of theirs. Materialized: locked once, whatever the join does.
_FOLDED = (
    _RANKED
    + """, first_owner AS (
    SELECT owner_id FROM ranked, flags WHERE NOT flags.urgent ORDER BY running, turn, owner_id LIMIT 1
), picked AS MATERIALIZED (
{pick}
)
SELECT picked.*, ranked.owner_id, ranked.turn, flags.urgent
FROM ranked CROSS JOIN flags LEFT JOIN picked ON picked.owner_id = ranked.owner_id
ORDER BY ranked.running, ranked.turn, ranked.owner_id
"""
)
FIRST_OWNER = "SELECT owner_id FROM first_owner"

# The database's clock (SQLite's to the millisecond, written as Django writes a time there, with
# six digits: its times are text, compared as text, and "…12.345" sorts before "…12.345000").
_NOW = {"postgresql": "STATEMENT_TIMESTAMP()", "sqlite": "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f000', 'NOW')"}

# A row of the ranking: (owner_id, turn, urgent).
Ranked = list[tuple[Any, ...]]


class DbNow(Now):
    """Django's Now(), read on SQLite as the ranking reads it: a time `runs.selectors.clock.db_now`
    took is due by it at once."""

    def as_sqlite(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        return self.as_sql(compiler, connection, template=_NOW["sqlite"].replace("%", "%%"), **extra_context)


def ranking(*, cap: int) -> Statement:
    """`_OWNERS`, its owners under `cap` running runs (0: no cap)."""
    return _written(_OWNERS, connection.vendor, cap), []


def folded(pick: Statement) -> Statement:
    """The ranking (no cap) with `pick` run in it: its rows as `ranking`'s, each led by `pick`'s
    columns, set on the first owner's row alone (PostgreSQL: `MATERIALIZED`)."""
    return _folded(pick[0], tuple(pick[1]), connection.vendor)


@cache
def _folded(pick: str, picking: tuple[Any, ...], vendor: str) -> Statement:
    # Built once per process: every claim a notification wakes sends it.
    head, tail = _FOLDED.split("{pick}")
    return _written(head, vendor, 0) + pick + _written(tail, vendor, 0), picking


@cache
def _written(sql: str, vendor: str, cap: int) -> str:
    """`sql` with its values written in, and the database's clock. Not parameters: the server plans
    a statement without any once per connection, and planned this one again at every execution
    (~1 ms), since a status given as a parameter cannot be proven to match the predicate of a
    partial index (`run_queued_turn`), which only a custom plan for that status may use."""
    values: dict[str, str | int] = {
        "queued": Status.QUEUED.value,
        "running": Status.RUNNING.value,
        "cap": cap,
        "urgent": PRIORITY_MAX,
    }
    return re.sub(r"%\((\w+)\)s", lambda name: _literal(values[name[1]]), sql).replace("{now}", _NOW[vendor])


def _literal(value: str | int) -> str:
    return str(int(value)) if isinstance(value, int) else "'" + value.replace("'", "''") + "'"
