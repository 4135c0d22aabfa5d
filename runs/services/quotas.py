"""Per-owner limits (docs/design/fair-use.md#caps), enforced where runs are made and claimed: the
active-runs cap and the caps on runs and bytes kept at create (and resume), the running cap with a
fair share of the workers at claim, and the cap on webhook endpoints. A count and the write it
allows must not race another of the same owner's, so each check first takes a transaction-scoped
advisory lock (on SQLite, whose IMMEDIATE transactions serialise writers, none is needed)."""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import IntEnum

from django.db import connection
from django.db.models import Count, Model, Q, QuerySet
from django.db.models.expressions import RawSQL
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from runs.conf import conf
from runs.exceptions import TooManyRequests
from runs.models import LIVE_VALUES, PRIORITY_MAX, TERMINAL_VALUES, Run, Schedule, WebhookEndpoint
from runs.selectors.clock import db_now
from runs.selectors.compiled import CompiledRead, Param, as_first
from runs.services.ranking import FIRST_OWNER, DbNow, Ranked, folded, ranking
from runs.services.statements import Statement, send_prepared
from runs.transitions import Status


class OwnerLock(IntEnum):
    # The first key of pg_advisory_xact_lock(int, int); the second is the owner's id (0: every owner).
    CREATE = 0x524C0001
    CLAIM = 0x524C0002
    WEBHOOKS = 0x524C0003
    SCHEDULES = 0x524C0004


def lock_owner(owner_id: int, purpose: OwnerLock) -> None:
    if lock := owner_lock(owner_id, purpose):
        send_prepared(*lock)


def owner_lock(owner_id: int, purpose: OwnerLock, *, taken: bool = True) -> list[Statement]:
    """The statement of `lock_owner`, for a caller that sends it with the read it guards (none on
    SQLite, or when not `taken`)."""
    if connection.vendor != "postgresql" or not taken:
        return []
    return [("SELECT pg_advisory_xact_lock(%s, %s)", [int(purpose), owner_id])]


# Under the running cap, claims take their turn: one lock for every owner, not one per owner. A
# claim may pass over owners at the cap before it finds a run, and holding each passed owner's lock
# while waiting for the next one's deadlocked two claims that met them in a different order
# (seen in CI). A claim is one short transaction, so the queue of claims is short.
EVERY_OWNER = 0


# What the caps count of an owner's runs, in one statement that reads the table only for their
# live runs (at most the active-runs cap of them, through `run_owner_live`): the ended ones' count
# and bytes come from the index `run_owner_ended` alone, since an ended run's bytes never change.
# (A sum of `stored_bytes` over all of an owner's runs would read a heap page per run.)
OWNED_SQL = f"""SELECT live.n, live.bytes, ended.n, ended.bytes
FROM (SELECT COUNT(*) AS n, COALESCE(SUM(stored_bytes), 0) AS bytes FROM {Run._meta.db_table}
      WHERE owner_id = %s AND status IN ({", ".join(["%s"] * len(LIVE_VALUES))})) live,
     (SELECT COUNT(*) AS n, COALESCE(SUM(ended_bytes), 0) AS bytes FROM {Run._meta.db_table}
      WHERE owner_id = %s AND status IN ({", ".join(["%s"] * len(TERMINAL_VALUES))})) ended
"""


@dataclass(frozen=True)
class Owned:
    active: int
    kept: int
    stored_bytes: int


def owned(owner_id: int, *, after: Sequence[Statement] = ()) -> Owned:
    """An owner's active runs, the runs they keep and the bytes those store; read in the round
    trip of the statements `after` names, after them (a statement of its own: its snapshot is taken
    once they are done, e.g. once an owner's lock is granted)."""
    found = send_prepared(*after, (OWNED_SQL, [owner_id, *LIVE_VALUES, owner_id, *TERMINAL_VALUES]))
    live, live_bytes, ended, ended_bytes = (int(value) for value in found[-1][0])
    return Owned(active=live, kept=live + ended, stored_bytes=live_bytes + ended_bytes)


def check_create(owner_id: int, *, input_bytes: int) -> None:
    """Refuse a new run (429) to an owner at one of the caps a create counts against: their active
    runs (RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER), the runs they keep, finished ones included until
    `purge_runs` deletes them (RUNLEDGER_MAX_RUNS_PER_USER), and the bytes those store with this
    run's input (RUNLEDGER_MAX_STORED_BYTES_PER_USER). Inside the creating transaction, before the
    insert: one lock on the owner, then one read of their totals (`owned`). No row of theirs is
    shared by their writes, so no append of theirs ever waits for another. The lock and the read go
    in one round trip: the read, a statement of its own, counts every create the lock waited for."""
    active_cap = conf.MAX_ACTIVE_RUNS_PER_USER
    runs_cap = conf.MAX_RUNS_PER_USER
    bytes_cap = conf.MAX_STORED_BYTES_PER_USER
    if active_cap is None and runs_cap is None and bytes_cap is None:
        return
    totals = owned(owner_id, after=owner_lock(owner_id, OwnerLock.CREATE))
    counted = [
        (
            active_cap,
            "active_runs",
            totals.active,
            "you have {} active runs, the most allowed "
            "(RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER); create more once some have ended",
        ),
        (
            runs_cap,
            "runs",
            totals.kept,
            "you keep {} runs, the most allowed (RUNLEDGER_MAX_RUNS_PER_USER); "
            "finished runs count until they are purged",
        ),
    ]
    for cap, name, count, message in counted:
        if cap is not None and count >= cap:
            raise _refused(message.format(count), **{name: count, "limit": cap})
    _check_bytes(stored=totals.stored_bytes, adding=input_bytes, cap=bytes_cap)


def check_stored_bytes(owner_id: int, *, adding_bytes: int) -> None:
    """Refuse (429) `adding_bytes` more (a resume's input) to an owner whose runs would then store
    more than RUNLEDGER_MAX_STORED_BYTES_PER_USER. Without the owner's lock: a resume holds its run's
    row lock, which a create under that run takes after the owner's, so waiting for the owner here
    could deadlock the two. The byte cap is approximate anyway — agents' events add to it unchecked
    — so concurrent writes may pass it by their own sizes."""
    cap = conf.MAX_STORED_BYTES_PER_USER
    if cap is not None:
        _check_bytes(stored=owned(owner_id).stored_bytes, adding=adding_bytes, cap=cap)


def _check_bytes(*, stored: int, adding: int, cap: int | None) -> None:
    if cap is not None and stored + adding > cap:
        raise _refused(
            f"your runs store {stored} bytes; {adding} more would pass the {cap} allowed "
            "(RUNLEDGER_MAX_STORED_BYTES_PER_USER); finished runs count until they are purged",
            stored_bytes=stored,
            adding_bytes=adding,
            limit=cap,
        )


def check_webhooks(owner_id: int) -> None:
    """Refuse (429) a new webhook endpoint to an owner who has RUNLEDGER_MAX_WEBHOOKS_PER_USER:
    under a lock on the owner, so two registrations at once never pass it."""
    said = "webhook endpoints, the most allowed (RUNLEDGER_MAX_WEBHOOKS_PER_USER); delete one to register another"
    _check_rows(owner_id, OwnerLock.WEBHOOKS, WebhookEndpoint, conf.MAX_WEBHOOKS_PER_USER, key="webhooks", said=said)


def check_schedules(owner_id: int) -> None:
    """Refuse (429) a new schedule to an owner who has RUNLEDGER_MAX_SCHEDULES_PER_USER: under a lock
    on the owner, so two creates at once never pass it."""
    said = "schedules, the most allowed (RUNLEDGER_MAX_SCHEDULES_PER_USER); delete one to create another"
    _check_rows(owner_id, OwnerLock.SCHEDULES, Schedule, conf.MAX_SCHEDULES_PER_USER, key="schedules", said=said)


def _check_rows(owner_id: int, purpose: OwnerLock, model: type[Model], cap: int | None, *, key: str, said: str) -> None:
    """The cap `cap` on an owner's rows of `model`, counted under the owner's lock for `purpose`:
    the 429's message is "you have N " and `said`, its detail the count under `key`."""
    if cap is None:
        return
    lock_owner(owner_id, purpose)
    count = model._default_manager.filter(owner_id=owner_id).count()
    if count >= cap:
        raise _refused(f"you have {count} {said}", **{key: count, "limit": cap})


def _refused(message: str, **detail: int) -> TooManyRequests:
    """The 429 of a cap: `detail` says where the owner is and what the limit is."""
    return TooManyRequests(message, retry_after=conf.LIMIT_RETRY_AFTER_SECONDS, detail=detail)


# Due: not scheduled, or its start_after has come (docs/design/fair-use.md#start-after).
DUE = Q(start_after__isnull=True) | Q(start_after__lte=DbNow())


def rank_ahead(*, newcomer: bool = False, expect_run: bool = False) -> Ranked | None:
    """The ranking `pick_queued` reads, read alone before the claim's transaction where it reads the
    same there — on PostgreSQL without a running cap: no lock guards it, and each statement reads its
    own snapshot anyway — for a claim that does not `expect_run` (a poll's, the one after a taken
    run: they mostly find nothing, and that is then this one statement and no transaction). None:
    read in the transaction. With the pick, in one statement, for a claim that expects a run (a
    round trip less to take it, one more, the COMMIT, to find none); after the claims' lock, under a
    running cap and for a kept slot; on SQLite, whose claims queue for the file's write lock first."""
    if connection.vendor != "postgresql" or newcomer or conf.MAX_RUNNING_PER_USER or expect_run:
        return None
    [ranked] = send_prepared(ranking(cap=0))
    return ranked


def pick_queued(*, newcomer: bool = False, ranked: Ranked | None = None) -> tuple[Run, datetime] | None:
    """Lock the queued run the next claim should take, skipping runs another claim holds, runs not
    due yet, and runs past their deadline (the sweeper stops those); None if there is none. With it,
    the database's clock as the statement that locked it read it (`runs.selectors.clock`): the
    claim's time, without a statement of its own.

    First a run whose priority jumps fair share (above PRIORITY_MAX), highest then oldest. Then fair
    share: owners in the ranking's order (`runs.services.ranking`), each owner's highest-priority
    run, oldest among equals, which takes the owner's earliest turn (`_take_turn`). `newcomer`: only
    an owner with no run running may have it — the slot a worker keeps for them
    (`Worker.newcomer_slots`), which is a running cap of 1 for this claim. Under a cap the claims'
    lock is taken before the ranking, so the counts it reads include every claim before it: an owner
    ranked below the cap stays below it until this claim commits (two workers' kept slots never go
    to one owner's two runs). The lock and the ranking go in one round trip, the ranking a statement
    of its own that reads after the lock is granted. `ranked`: the ranking `rank_ahead` read; None
    on PostgreSQL without a cap: read with the first owner's pick (`_pick_first`)."""
    cap = 1 if newcomer else (conf.MAX_RUNNING_PER_USER or 0)
    tried = 0
    if ranked is None and not cap and connection.vendor == "postgresql":
        ranked, picked = _pick_first()
        if picked is not None:
            return picked
        # It looked at the first owner's runs (another claim holds each, or none may start), unless
        # an urgent run is queued: then at none.
        tried = 0 if ranked and ranked[0][2] else 1
    elif ranked is None:
        *_, ranked = send_prepared(*owner_lock(EVERY_OWNER, OwnerLock.CLAIM, taken=bool(cap)), ranking(cap=cap))
    if not ranked:
        return None
    if ranked[0][2]:
        [rows] = send_prepared(_URGENT.statement(cap))
        run = next(iter(_URGENT.from_rows(rows, cap)), None)
        if run is not None:
            return run, _clock(run)
    for owner_id, turn, _ in ranked[tried:]:
        [rows] = send_prepared(_FAIR.statement(owner=owner_id))
        run = next(iter(_FAIR.from_rows(rows)), None)
        if run is not None:
            _take_turn(run, _datetime(turn))
            return run, _clock(run)
    return None


def _pick_first() -> tuple[Ranked, tuple[Run, datetime] | None]:
    """The ranking (no cap), and the first owner's claimable run locked by the statement that reads
    it, with that statement's clock: one round trip, with the transaction's BEGIN. No run when an
    urgent run is queued, or when none of the first owner's is free to take."""
    [rows] = send_prepared(folded(_FIRST.statement()))
    ranked = [row[-3:] for row in rows]
    if not rows or rows[0][0] is None:
        return ranked, None
    run = _FIRST.from_rows([rows[0][:-3]])[0]
    _take_turn(run, _datetime(ranked[0][1]))
    return ranked, (run, _clock(run))


def _queued() -> QuerySet[Run]:
    """The queue's runs that are due, locked as they are read, passing over those others hold."""
    return Run.objects.select_for_update(no_key=True, skip_locked=True).filter(DUE, status=Status.QUEUED)


def _claimable() -> QuerySet[Run]:
    """The queue's runs a claim may take, highest priority then oldest first, with the database's
    clock as the statement reads it (PostgreSQL; elsewhere `_clock` reads it)."""
    within = _queued().filter(Q(deadline__isnull=True) | Q(deadline__gt=DbNow()))
    claimable = within.order_by("-priority", "created_at", "id")
    return claimable.annotate(clock=DbNow()) if connection.vendor == "postgresql" else claimable


def _urgent_pick(cap: int) -> QuerySet[Run]:
    """The claimable run whose priority jumps fair share (above PRIORITY_MAX), its owner under `cap`."""
    urgent = _claimable().filter(priority__gt=PRIORITY_MAX)
    if cap:
        # The caps still hold for it: it jumps the line, not the limits.
        busy = Run.objects.filter(status=Status.RUNNING).values("owner_id").annotate(n=Count("id")).filter(n__gte=cap)
        urgent = urgent.exclude(owner_id__in=busy.values("owner_id"))
    return as_first(urgent)


# The picks, compiled once per process (runs.selectors.compiled): building and compiling their
# querysets cost more Python than their round trips, on every claim a notification wakes. Their
# constants inlined: with the status a parameter the server may plan them again at every claim (a
# generic plan cannot use the partial index `run_queued_pick`).
_URGENT = CompiledRead(Run, _urgent_pick, inline=True)
_FAIR = CompiledRead(
    Run,
    lambda *, owner: as_first(_claimable().filter(owner_id=owner)),
    inline=True,
    owner=Param(Run._meta.get_field("owner"), (-271828, -314159)),
)
# The first-ranked owner's, in the ranking's statement (`ranking.folded`).
_FIRST = CompiledRead(Run, lambda: as_first(_claimable().filter(owner_id=RawSQL(FIRST_OWNER, ()))), inline=True)


def _clock(run: Run) -> datetime:
    """The clock its locking statement read (PostgreSQL); elsewhere `db_now`'s, read now (to the
    millisecond, as every later reading of it: a heartbeat in the claim's millisecond never moves
    the lease back)."""
    clock: datetime | None = getattr(run, "clock", None)
    return clock if clock is not None else db_now()


def _take_turn(run: Run, turn: datetime) -> None:
    """The locked `run`, picked for its priority, takes its owner's earliest turn, and the run that
    held that turn takes the later one `run` had: an owner's turns stay those their runs' times
    give, whatever the priorities, so a priority never moves an owner ahead of another. The caller
    saves `run`. A holder that another transaction has locked keeps its turn (it is being claimed or
    ended, and leaves the queue)."""
    if run.turn_at is None or run.turn_at <= turn:
        return
    holder = _queued().filter(owner_id=run.owner_id, turn_at=turn).exclude(pk=run.pk).values_list("pk", flat=True)
    holder_id = holder.order_by("id").first()
    if holder_id is not None:
        Run.objects.filter(pk=holder_id).update(turn_at=run.turn_at)
    run.turn_at = turn


def _datetime(value: datetime | str) -> datetime:
    """A time read by raw SQL: a string on SQLite (UTC, as Django stores it there)."""
    if isinstance(value, datetime):
        return value
    parsed = parse_datetime(value)
    assert parsed is not None, value
    return parsed if timezone.is_aware(parsed) else timezone.make_aware(parsed, UTC)
