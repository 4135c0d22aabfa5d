"""Statements sent together (runs.services.statements): in order, in the open transaction, one round
trip on PostgreSQL; and the ORM's own INSERT and UPDATE, built without being sent."""

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.utils import DatabaseError
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs.models import Run, RunAttempt
from runs.services.statements import insert_statement, inserted, send_together, update_statement
from tests.conftest import ON_SQLITE
from tests.factories import queued_run

pytestmark = [pytest.mark.sqlite, pytest.mark.django_db(transaction=True)]


def test_statements_sent_together_run_in_order_and_each_answers_its_own_rows(alice: User) -> None:
    run = queued_run(alice)
    table, pk = Run._meta.db_table, _pk(run)
    with transaction.atomic(), CaptureQueriesContext(connection) as captured:
        answers = send_together(
            (f"SELECT priority FROM {table} WHERE id = %s", [pk]),
            (f"UPDATE {table} SET priority = %s WHERE id = %s", [7, pk]),
            # Its own snapshot, after the update before it: it reads the new value.
            (f"SELECT priority, %s FROM {table} WHERE id = %s", ["50%", pk]),
        )
    assert answers == [[(0,)], [], [(7, "50%")]]
    # One round trip on PostgreSQL; one per statement elsewhere.
    sent = [q for q in captured.captured_queries if q["sql"] not in ("BEGIN", "BEGIN IMMEDIATE", "COMMIT")]
    assert len(sent) == (3 if ON_SQLITE else 1)


def test_a_statement_that_fails_takes_the_ones_before_it_back_with_the_transaction(alice: User) -> None:
    run = queued_run(alice)
    pk = _pk(run)
    with pytest.raises(DatabaseError), transaction.atomic():
        send_together(
            (f"UPDATE {Run._meta.db_table} SET priority = %s WHERE id = %s", [7, pk]),
            ("SELECT * FROM no_such_table", []),
        )
    run.refresh_from_db()
    assert run.priority == 0


def test_the_built_insert_and_update_are_the_ones_the_orm_sends(alice: User) -> None:
    run = queued_run(alice)
    now = timezone.now()

    def attempt() -> RunAttempt:
        lease = now + timedelta(seconds=30)
        return RunAttempt(run=run, generation=1, worker="w", claimed_at=now, heartbeat_at=now, lease_expires_at=lease)

    by_the_orm = _sent(lambda: attempt().save())
    RunAttempt.objects.filter(run=run).delete()
    ours = attempt()

    def insert() -> None:
        with transaction.atomic():
            [returned] = send_together(insert_statement([ours], returning_pk=True))
            inserted([ours], returned)

    assert _sent(insert) == by_the_orm
    assert not ours._state.adding and RunAttempt.objects.get(run=run).pk == ours.pk

    run.priority, run.updated_at = 5, now
    by_the_orm = _sent(lambda: run.save(update_fields=["priority", "updated_at"]))
    run.priority = 6

    def update() -> None:
        with transaction.atomic():
            send_together(update_statement(run, ["priority", "updated_at"]))

    assert _sent(update) == [sql.replace("= 5,", "= 6,") for sql in by_the_orm]
    assert Run.objects.get(pk=run.pk).priority == 6


def _sent(call: Callable[[], object]) -> list[str]:
    """The statements `call` sent, as Django logged them (parameters in place), but BEGIN and COMMIT."""
    with CaptureQueriesContext(connection) as captured:
        call()
    return [q["sql"] for q in captured.captured_queries if q["sql"] not in ("BEGIN", "BEGIN IMMEDIATE", "COMMIT")]


def _pk(run: Run) -> object:
    """The run's id as raw SQL takes it (SQLite stores a UUID as its hex)."""
    return run.pk.hex if ON_SQLITE else run.pk
