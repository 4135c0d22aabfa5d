"""Per-owner limits of DESIGN §6, enforced where runs are made and claimed: the active-runs cap at
create, and the running cap with a fair share of the workers at claim.

A count and the write it allows must not race another of the same owner's (two creates at 999 of
1,000 would both pass), so each check first takes a transaction-scoped advisory lock — a create
on its owner, a claim under the running cap on every owner (`EVERY_OWNER`): the count, read after
the lock, sees every write that held it before.
On SQLite, whose IMMEDIATE transactions already serialise writers, there is nothing to take.
"""

from enum import IntEnum

from django.db import connection
from django.db.models import Q
from django.db.models.functions import Now

from runs.exceptions import TooManyRequests
from runs.limits import limit, retry_after
from runs.models import LIVE_VALUES, Run
from runs.transitions import Status


class OwnerLock(IntEnum):
    # The first key of pg_advisory_xact_lock(int, int); the second is the owner's id (0: every owner).
    CREATE = 0x524C0001
    CLAIM = 0x524C0002


def lock_owner(owner_id: int, purpose: OwnerLock) -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [int(purpose), owner_id])


# Under the running cap, claims take their turn: one lock for every owner, not one per owner. A
# claim may pass over owners at the cap before it finds a run, and holding each passed owner's lock
# while waiting for the next one's deadlocked two claims that met them in a different order
# (seen in CI). A claim is one short transaction, so the queue of claims is short.
EVERY_OWNER = 0


def check_active_runs(owner_id: int) -> None:
    """Refuse a new run (429) to an owner who already has the most active runs allowed
    (RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER). Inside the creating transaction, before the insert."""
    cap = limit("RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER")
    if cap is None:
        return
    lock_owner(owner_id, OwnerLock.CREATE)
    active = Run.objects.filter(owner_id=owner_id, status__in=LIVE_VALUES).count()
    if active >= cap:
        raise TooManyRequests(
            f"you have {active} active runs, the most allowed (RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER); "
            "create more once some have ended",
            retry_after=retry_after(),
            detail={"active_runs": active, "limit": cap},
        )


# Owners with queued runs, in the order claims serve them: the fewest running runs first, then the
# one whose oldest queued run is oldest. The recursive part walks `run_queued_owner` one owner at a
# time, and each count and minimum is an index lookup, so the cost follows the number of owners
# waiting, not the number of runs queued. Owners at the running cap are left out.
_OWNERS = """
WITH RECURSIVE owners(owner_id) AS (
    SELECT MIN(owner_id) FROM runs_run WHERE status = %(queued)s
    UNION ALL
    SELECT (SELECT MIN(q.owner_id) FROM runs_run q WHERE q.status = %(queued)s AND q.owner_id > owners.owner_id)
    FROM owners WHERE owners.owner_id IS NOT NULL
), ranked AS (
    SELECT owner_id,
           (SELECT COUNT(*) FROM runs_run r WHERE r.owner_id = owners.owner_id AND r.status = %(running)s) AS running,
           (SELECT MIN(q.created_at) FROM runs_run q WHERE q.owner_id = owners.owner_id AND q.status = %(queued)s)
               AS oldest
    FROM owners WHERE owner_id IS NOT NULL
)
SELECT owner_id FROM ranked WHERE %(cap)s = 0 OR running < %(cap)s ORDER BY running, oldest, owner_id
"""


def pick_queued() -> Run | None:
    """Lock the queued run the next claim should take, skipping runs another claim holds and runs
    past their deadline (the sweeper stops those); None if there is none.

    Fair share: owners in `_OWNERS` order, each owner's oldest run. Under the running cap the
    claims' lock is taken before the ranking, so the counts it reads include every claim before
    it: an owner ranked below the cap stays below it until this claim commits."""
    cap = limit("RUNLEDGER_MAX_RUNNING_PER_USER") or 0
    if cap:
        lock_owner(EVERY_OWNER, OwnerLock.CLAIM)
    with connection.cursor() as cursor:
        cursor.execute(_OWNERS, {"queued": Status.QUEUED.value, "running": Status.RUNNING.value, "cap": cap})
        owners = [row[0] for row in cursor.fetchall()]
    queued = (
        Run.objects.select_for_update(no_key=True, skip_locked=True)
        .filter(status=Status.QUEUED)
        .filter(Q(deadline__isnull=True) | Q(deadline__gt=Now()))
        .order_by("created_at", "id")
    )
    for owner_id in owners:
        run = queued.filter(owner_id=owner_id).first()
        if run is not None:
            return run
    return None
