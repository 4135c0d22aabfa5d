"""The order claims serve owners in (docs/design/fair-use.md#fair-claiming), as SQL: the ranking a
claim reads (docs/design/execution.md#claims)."""

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
# not the number of runs queued. Owners at the running cap are left out. Each row also says whether
# any run that jumps fair share is queued (`run_queued_urgent`, an index almost always empty), so
# the claim looks for one only then. No row at all: nothing is claimable, urgent or not (an urgent
# run's owner is in the list unless its runs are not due or the owner is at the cap, which rule it
# out as well).
_OWNERS = """
WITH RECURSIVE owners(owner_id) AS (
    SELECT MIN(owner_id) FROM runs_run WHERE status = %(queued)s
    UNION ALL
    SELECT (SELECT MIN(q.owner_id) FROM runs_run q WHERE q.status = %(queued)s AND q.owner_id > owners.owner_id)
    FROM owners WHERE owners.owner_id IS NOT NULL
), ranked AS (
    SELECT owner_id,
           (SELECT COUNT(*) FROM runs_run r WHERE r.owner_id = owners.owner_id AND r.status = %(running)s) AS running,
           (SELECT MIN(q.turn_at) FROM runs_run q WHERE q.owner_id = owners.owner_id AND q.status = %(queued)s
                AND (q.start_after IS NULL OR q.start_after <= {now})) AS turn
    FROM owners WHERE owner_id IS NOT NULL
)
SELECT owner_id, turn,
       EXISTS (SELECT 1 FROM runs_run u WHERE u.status = %(queued)s AND u.priority > %(urgent)s) AS urgent
FROM ranked
WHERE turn IS NOT NULL AND (%(cap)s = 0 OR running < %(cap)s) ORDER BY running, turn, owner_id
"""
# The database's clock (SQLite's to the millisecond, written as Django writes a time there, with
# six digits: its times are text, compared as text, and "…12.345" sorts before "…12.345000").
_NOW = {"postgresql": "STATEMENT_TIMESTAMP()", "sqlite": "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f000', 'NOW')"}


class DbNow(Now):
    """Django's Now(), read on SQLite as the ranking reads it: a time `runs.selectors.clock.db_now`
    took is due by it at once."""

    def as_sqlite(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        return self.as_sql(compiler, connection, template=_NOW["sqlite"].replace("%", "%%"), **extra_context)


# A row of the ranking: (owner_id, turn, urgent).
Ranked = list[tuple[Any, ...]]


def ranking(*, cap: int) -> Statement:
    """`_OWNERS`, its owners under `cap` running runs (0: no cap), with positional parameters, to go
    with other statements (`send_prepared`)."""
    sql, names = _positional(_OWNERS, connection.vendor)
    values = {"queued": Status.QUEUED.value, "running": Status.RUNNING.value, "cap": cap, "urgent": PRIORITY_MAX}
    return sql, [values[name] for name in names]


@cache
def _positional(sql: str, vendor: str) -> tuple[str, tuple[str, ...]]:
    """`sql` with positional parameters, and the names they take the values of, in order: built
    once, not at every claim."""
    names = tuple(re.findall(r"%\((\w+)\)s", sql))
    return re.sub(r"%\(\w+\)s", "%s", sql).replace("{now}", _NOW[vendor]), names
