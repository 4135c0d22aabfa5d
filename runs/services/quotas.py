"""Per-owner limits of DESIGN §6, enforced where runs are made and claimed: the active-runs cap at
create, and the running cap with a fair share of the workers at claim.

A count and the write it allows must not race another of the same owner's (two creates at 999 of
1,000 would both pass), so each check first takes a transaction-scoped advisory lock on the owner,
one key space per purpose: the count, read after the lock, sees every write that held it before.
On SQLite, whose IMMEDIATE transactions already serialise writers, there is nothing to take.
"""

from enum import IntEnum

from django.db import connection

from runs.exceptions import TooManyRequests
from runs.limits import limit, retry_after
from runs.models import Run
from runs.transitions import TERMINAL, Status


class OwnerAtCap(Exception):
    """The run picked for a claim belongs to an owner a concurrent claim just took to the running
    cap: roll back and pick again."""


class OwnerLock(IntEnum):
    # The first key of pg_advisory_xact_lock(int, int); the second is the owner's id.
    CREATE = 0x524C0001
    CLAIM = 0x524C0002


def lock_owner(owner_id: int, purpose: OwnerLock) -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [int(purpose), owner_id])


def check_active_runs(owner_id: int) -> None:
    """Refuse a new run (429) to an owner who already has the most active runs allowed
    (RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER). Inside the creating transaction, before the insert."""
    cap = limit("RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER")
    if cap is None:
        return
    lock_owner(owner_id, OwnerLock.CREATE)
    active = Run.objects.filter(owner_id=owner_id).exclude(status__in=TERMINAL).count()
    if active >= cap:
        raise TooManyRequests(
            f"you have {active} active runs, the most allowed (RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER); "
            "create more once some have ended",
            retry_after=retry_after(),
            detail={"active_runs": active, "limit": cap},
        )


# The claim's pick: queued runs not past their deadline, those of owners with the fewest running
# runs first, the oldest first among equals; owners at the running cap are passed over. Running
# runs are few (workers times their concurrency), so counting them per owner is cheap; the queued rows are
# read through the partial index `run_queued`.
_PICK = """
WITH running AS (
    SELECT owner_id, count(*) AS n FROM runs_run WHERE status = %(running)s GROUP BY owner_id
)
SELECT r.* FROM runs_run r LEFT JOIN running ON running.owner_id = r.owner_id
WHERE r.status = %(queued)s
  AND (r.deadline IS NULL OR r.deadline > {now})
  AND (%(cap)s = 0 OR COALESCE(running.n, 0) < %(cap)s)
ORDER BY COALESCE(running.n, 0), r.created_at, r.id
LIMIT 1
"""


def pick_queued() -> Run | None:
    """Lock the queued run the next claim should take (see `_PICK`), skipping runs another
    claim holds; None if there is none. Under the running cap the owner is locked and their count
    read again: a claim that committed meanwhile may have taken the owner to the cap (`OwnerAtCap`)."""
    cap = limit("RUNLEDGER_MAX_RUNNING_PER_USER") or 0
    if connection.vendor == "postgresql":
        sql = _PICK.format(now="STATEMENT_TIMESTAMP()") + " FOR NO KEY UPDATE OF r SKIP LOCKED"
    else:
        # As Django stores datetimes in SQLite: text, UTC, microseconds.
        sql = _PICK.format(now="STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')")
    params = {"running": Status.RUNNING.value, "queued": Status.QUEUED.value, "cap": cap}
    run = next(iter(Run.objects.raw(sql, params)), None)
    if run is None or not cap:
        return run
    lock_owner(run.owner_id, OwnerLock.CLAIM)
    if Run.objects.filter(owner_id=run.owner_id, status=Status.RUNNING).count() >= cap:
        raise OwnerAtCap(run.owner_id)
    return run
