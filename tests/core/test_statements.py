"""Statements sent together (runs.services.statements): in order, in the open transaction, each
one's rows back; one round trip on PostgreSQL, where each statement takes its own snapshot. And a
command's last writes held and sent with its COMMIT (`holding`): the tests without the `sqlite`
mark are PostgreSQL's."""

import uuid
import warnings
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from django.apps import apps
from django.contrib.auth.models import User
from django.db import IntegrityError, connection, transaction
from django.db.utils import DatabaseError
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django.utils.translation import gettext_lazy
from psycopg.pq import TransactionStatus

from runs.models import Run, RunAttempt, RunEvent
from runs.notify import conninfo
from runs.services.core import lock_run
from runs.services.creation import RunSpec, insert_run
from runs.services.statements import (
    _saver,
    from_row,
    holding,
    insert,
    inserted,
    send_last,
    send_prepared,
    send_together,
    update,
)
from runs.transitions import Status
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


def _outcome(prepare: Any) -> tuple[Any, ...]:
    """What preparing a value gave, comparable: its type and value (a JSON adapter's object), or the
    error's type and message; and the warnings it raised."""
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        try:
            value = prepare()
        except Exception as exc:
            return type(exc), str(exc), [str(w.message) for w in warned]
    return type(value), getattr(value, "obj", value), [str(w.message) for w in warned]


@pytest.mark.sqlite
def test_each_value_is_saved_as_django_saves_it() -> None:
    """`insert` and `update` prepare the value of each field (`_saver`), taking a short way for the
    type a kind of field is mostly given: what they send is what `get_db_prep_save` gives, for every
    field of every model, whatever the value."""
    now = timezone.now()
    samples = [
        *(None, "", "text", Status.RUNNING, gettext_lazy("lazy"), 0, 7, -3, 2**40, True, 1.5, Decimal("2")),
        *(now, now.replace(tzinfo=None), now.astimezone(timezone.get_fixed_timezone(120)), now.date()),
        *(uuid.uuid4(), str(uuid.uuid4()), {"a": [1]}, [1, "b"]),
    ]
    differ = [
        (model.__name__, field.name, value)
        for model in apps.get_app_config("runs").get_models()
        for field in model._meta.concrete_fields
        for value in samples
        if _outcome(lambda: _saver(field)(SimpleNamespace(**{field.attname: value}), connection))  # noqa: B023
        != _outcome(lambda: field.get_db_prep_save(value, connection))  # noqa: B023
    ]
    assert differ == []


# Held writes (`holding`, `send_last`): a command's last writes go with its COMMIT.


@pytest.mark.sqlite
def test_held_writes_are_sent_before_the_next_statement_and_answer_their_rows(alice: User) -> None:
    run = queued_run(alice)
    answered: list[Any] = []
    with transaction.atomic(durable=True), holding():
        send_last(
            update_priority(run, 7), ("SELECT priority FROM runs_run WHERE id = %s", [run.pk.hex]), then=answered.append
        )
        # The ORM's next read goes after them, and sees them
        assert Run.objects.get(pk=run.pk).priority == 7
        assert answered == [[[], [(7,)]]]
    run.refresh_from_db()
    assert run.priority == 7


@pytest.mark.sqlite
def test_held_writes_of_a_block_that_fails_are_never_sent(alice: User) -> None:
    run = queued_run(alice)
    answered: list[Any] = []
    with pytest.raises(ZeroDivisionError), transaction.atomic(durable=True), holding():
        send_last(update_priority(run, 7), then=answered.append)
        raise ZeroDivisionError
    run.refresh_from_db()
    assert run.priority == 0
    # PostgreSQL held them; SQLite sent them at once, and rolled them back
    assert answered == ([[[]]] if ON_SQLITE else [])


def test_held_writes_and_the_commit_go_in_one_round_trip_and_django_s_commit_sends_nothing(alice: User) -> None:
    run = queued_run(alice)
    committed: list[bool] = []
    with CaptureQueriesContext(connection) as captured, transaction.atomic(durable=True):
        with holding():
            lock_run(run.pk)
            send_last(update_priority(run, 7))
            transaction.on_commit(lambda: committed.append(True))
        # Committed already (what a service's block ends with): others see it, and Django's COMMIT
        # finds no transaction to end
        assert connection.connection.pgconn.transaction_status == TransactionStatus.IDLE
        assert committed == []
        with psycopg.connect(**conninfo(), autocommit=True) as other:
            assert other.execute("SELECT priority FROM runs_run WHERE id = %s", [run.pk]).fetchone() == (7,)
    assert committed == [True]
    sent = [q["sql"] for q in captured.captured_queries]
    assert len(sent) == 4 and sent[0] == "BEGIN" and sent[-1] == "COMMIT", sent
    assert sent[2].startswith("UPDATE") and sent[2].endswith(";\nCOMMIT"), sent


def test_a_commit_refused_with_the_held_writes_raises_and_runs_no_on_commit_hook(alice: User) -> None:
    run, now = queued_run(alice), timezone.now()
    orphan = RunEvent(run_id=uuid.uuid4(), seq=1, type="run.created", data={}, created_at=now, data_bytes=2)
    committed: list[bool] = []
    with pytest.raises(IntegrityError), transaction.atomic(durable=True), holding():
        send_last(update_priority(run, 7), insert([orphan]))
        transaction.on_commit(lambda: committed.append(True))
    run.refresh_from_db()
    assert (run.priority, committed) == (0, [])
    # The connection goes on
    with transaction.atomic(durable=True), holding():
        lock_run(run.pk)
        send_last(update_priority(run, 8))
    run.refresh_from_db()
    assert run.priority == 8


def test_inside_another_transaction_held_writes_are_sent_and_nothing_committed(alice: User) -> None:
    """A test's transaction, or any atomic block around the command's: its end commits, not `holding`."""
    run = queued_run(alice)
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        with transaction.atomic(), holding():
            send_last(update_priority(run, 7))
        assert Run.objects.get(pk=run.pk).priority == 7
        raise ZeroDivisionError
    run.refresh_from_db()
    assert run.priority == 0
