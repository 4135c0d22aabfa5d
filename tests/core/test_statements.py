"""Statements sent together (runs.services.statements): in order, in the open transaction, each
one's rows back; one round trip on PostgreSQL, where each statement takes its own snapshot."""

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.utils import DatabaseError
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs.models import Run, RunAttempt
from runs.services.core import lock_run
from runs.services.creation import RunSpec, insert_run
from runs.services.statements import from_row, insert, inserted, send_prepared, send_together, update
from tests.conftest import ON_SQLITE
from tests.factories import queued_run
from tests.support.threads import first_holds_second_waits

pytestmark = pytest.mark.django_db(transaction=True)

COUNT = ("SELECT COUNT(*) FROM runs_run", [])

# Sent together by the simple protocol, or prepared in pipeline mode (runs.prepared): the same
# answers, the same round trip, the same snapshots.
SENDS = pytest.mark.parametrize("send", [send_together, send_prepared], ids=["together", "prepared"])


@pytest.mark.sqlite
@SENDS
def test_each_statement_sees_the_ones_before_it_and_answers_its_own_rows(alice: User, send: Any) -> None:
    run = queued_run(alice)
    run.agent = "renamed"
    with transaction.atomic(), CaptureQueriesContext(connection) as captured:
        changed, read, counted = send(
            update(run, ["agent"]), ("SELECT id, agent FROM runs_run WHERE id = %s", [run.pk.hex]), COUNT
        )
    assert (changed, counted) == ([], [(1,)])
    assert [agent for _, agent in read] == ["renamed"]
    # One round trip on PostgreSQL; elsewhere one by one.
    assert len(captured.captured_queries) == (3 if ON_SQLITE else 1)


@pytest.mark.sqlite
def test_a_row_read_back_is_the_instance_the_orm_reads(alice: User) -> None:
    run = queued_run(alice, metadata={"customer": "42"})
    columns = ", ".join(f.column for f in Run._meta.concrete_fields)
    ((row,),) = send_together((f"SELECT {columns} FROM runs_run WHERE id = %s", [run.pk.hex]))
    read, orm = from_row(Run, row), Run.objects.get(pk=run.pk)
    assert [getattr(read, f.attname) for f in Run._meta.concrete_fields] == [
        getattr(orm, f.attname) for f in Run._meta.concrete_fields
    ]
    assert not read._state.adding


@SENDS
def test_a_statement_after_a_lock_waited_for_sees_what_committed_meanwhile(alice: User, send: Any) -> None:
    """The property the commands build on (a lock's `Around`, the caps' count after the owner's
    lock): the statement after a lock takes its snapshot once the lock is granted."""
    run = queued_run(alice)
    before = Run.objects.count()
    counted: list[int] = []

    def lock_then_count() -> None:
        with transaction.atomic():
            lock = (f"SELECT id FROM runs_run WHERE id = '{run.pk}' FOR UPDATE", [])
            counted.append(send(lock, COUNT)[1][0][0])

    def hold_and_create() -> None:
        lock_run(run.pk)
        insert_run(RunSpec(agent="demo", input={}), owner=alice, capped=False)

    first_holds_second_waits(hold_and_create, lock_then_count)
    assert counted == [before + 1]


@pytest.mark.sqlite
@SENDS
def test_a_statement_that_fails_takes_the_ones_before_it_back_with_the_transaction(alice: User, send: Any) -> None:
    run = queued_run(alice)
    with pytest.raises(DatabaseError), transaction.atomic():
        send(update_priority(run, 7), ("SELECT * FROM no_such_table", []))
    run.refresh_from_db()
    assert run.priority == 0


def update_priority(run: Run, priority: int) -> tuple[str, list[object]]:
    run.priority = priority
    sql, params = update(run, ["priority"])
    return sql, list(params)


@pytest.mark.sqlite
def test_an_insert_returning_its_key_leaves_the_instance_saved_as_the_orm_would(alice: User) -> None:
    run, now = queued_run(alice), timezone.now()
    attempt = RunAttempt(run=run, generation=1, worker="w", claimed_at=now, heartbeat_at=now, lease_expires_at=now)
    with transaction.atomic():
        [returned] = send_together(insert([attempt], returning=True))
        inserted([attempt], returned)
    assert not attempt._state.adding
    stored = RunAttempt.objects.get(run=run)
    assert stored.pk == attempt.pk and (stored.worker, stored.claimed_at) == ("w", now)
