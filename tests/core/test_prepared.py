"""Hot statements sent prepared (runs.prepared, docs/design/deployment.md#prepared): a request's
token read, run read and the run's lock run as statements prepared on the request's connection; a
failed transaction, a reconnect or a changed table leaves none stale or broken in use; the setting
turns it off. PostgreSQL only (SQLite has no prepared statements of this kind)."""

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import User
from django.db import OperationalError, connection, transaction
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from runs.exceptions import NotFound
from runs.prepared import _KEPT_CURSORS, prepared_cursor, send_pipelined
from runs.services.locks import lock_run
from tests.factories import queued_run, running_run
from tests.support.db import token_for
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def prepared() -> list[str]:
    """The statements prepared on this thread's connection, as the server holds them."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE NOT from_sql")
        return [row[0] for row in cursor.fetchall()]


def new_session() -> None:
    """This thread's next statement on a server session of its own (a pool's too: closed)."""
    connection.close()
    if connection.pool:
        connection.close_pool()


def holding(texts: list[str], *parts: str) -> list[str]:
    return [text for text in texts if all(part in text for part in parts)]


@pytest.fixture
def api(alice: User) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_for(alice)}")
    return client


def requests(api: APIClient, alice: User) -> None:
    """A create (the owner's lock and the caps' counts), a claim (the owners' ranking), a read and a
    cancel of the running run (the token, the run, the lock and what an end looks at)."""
    ahead = (timezone.now() + timedelta(hours=1)).isoformat()
    assert (
        api.post("/api/runs/", {"agent": "demo", "input": {}, "start_after": ahead}, format="json").status_code == 201
    )
    run = running_run(alice)
    assert api.get(f"/api/runs/{run.pk}/").status_code == 200
    assert api.post(f"/api/runs/{run.pk}/cancel/", {}).status_code == 200


def test_a_request_s_hot_statements_are_prepared_on_its_connection(api: APIClient, alice: User) -> None:
    new_session()
    requests(api, alice)
    texts = prepared()
    # Each with its values as parameters, each prepared once however often it ran
    assert len(holding(texts, '"runs_apitoken"."digest" = $')) == 1, texts
    assert len(holding(texts, 'FROM "runs_run"', 'WHERE "runs_run"."id" = $')) == 1, texts
    assert len(holding(texts, "FOR NO KEY UPDATE OF r", "WHERE r.id = $1")) == 1, texts
    assert len(holding(texts, "FROM runs_webhookendpoint WHERE enabled")) == 1, texts
    assert len(holding(texts, "pg_advisory_xact_lock($1, $2)")) == 1, texts
    assert len(holding(texts, "SELECT live.n, live.bytes, ended.n, ended.bytes")) == 1, texts
    assert len(holding(texts, "WITH RECURSIVE owners(owner_id)")) == 1, texts
    before = len(texts)
    requests(api, alice)
    assert len(prepared()) == before


def test_the_events_reads_that_pages_and_streams_share_are_prepared(api: APIClient, alice: User) -> None:
    run = running_run(alice)
    new_session()
    for _ in range(2):
        assert api.get(f"/api/runs/{run.pk}/events/").status_code == 200  # what a stream's reads send too
        assert api.get(f"/api/runs/{run.pk}/events/?types=run.started").status_code == 200
    texts = prepared()
    # A range of seqs, and the chosen types: each prepared once (both cut at the page's bytes)
    assert len(holding(texts, "FROM runs_runevent", "(SELECT last FROM cut)")) == 2, texts
    assert len(holding(texts, "FROM runs_runevent", "type = ANY($")) == 1, texts


def test_a_failed_transaction_leaves_no_prepared_statement_and_the_next_lock_prepares_again(alice: User) -> None:
    run = queued_run(alice)
    with transaction.atomic():
        lock_run(run.pk, ending=True)
    assert holding(prepared(), "FOR NO KEY UPDATE OF r")
    with pytest.raises(NotFound), transaction.atomic():
        lock_run(run.pk, ending=True)
        raise NotFound("taken back")
    # psycopg deallocates every statement at a rollback: nothing prepared in it is trusted after
    assert prepared() == []
    with transaction.atomic():
        assert lock_run(run.pk, ending=True).pk == run.pk
    assert holding(prepared(), "FOR NO KEY UPDATE OF r")


def test_a_statement_that_fails_in_the_lock_s_round_trip_fails_the_transaction_and_leaves_the_next_one_sound(
    alice: User,
) -> None:
    run = queued_run(alice)
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '50ms'")
    try:
        with psycopg.connect(_dsn(), autocommit=False) as other:
            other.execute("SELECT 1 FROM runs_run WHERE id = %s FOR UPDATE", [run.pk])
            with pytest.raises(Exception, match="lock timeout"), transaction.atomic():
                lock_run(run.pk, ending=True)
            other.rollback()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    with transaction.atomic():
        assert lock_run(run.pk, ending=True).pk == run.pk


def _dsn() -> str:
    settings: dict[str, Any] = connection.settings_dict
    return psycopg.conninfo.make_conninfo(
        dbname=settings["NAME"],
        user=settings["USER"] or None,
        password=settings["PASSWORD"] or None,
        host=settings["HOST"] or None,
        port=settings["PORT"] or None,
    )


def test_a_new_connection_prepares_its_statements_anew(api: APIClient, alice: User) -> None:
    requests(api, alice)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (first,) = cursor.fetchone()
    new_session()
    assert prepared() == []
    requests(api, alice)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] != first
    assert holding(prepared(), "FOR NO KEY UPDATE OF r")


def test_a_session_that_died_takes_its_prepared_statements_with_it(alice: User) -> None:
    """The server ends the session (a restart, a terminated backend): the next statement fails once,
    the request's end drops the connection as Django drops any broken one, and the next session
    prepares its statements anew, never naming one the dead session held."""
    run = queued_run(alice)
    with transaction.atomic():
        lock_run(run.pk, ending=True)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (dead,) = cursor.fetchone()
    with psycopg.connect(_dsn(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [dead])
    with pytest.raises(OperationalError), transaction.atomic():
        lock_run(run.pk, ending=True)
    connection.close_if_unusable_or_obsolete()  # what the request's end does
    for _ in range(2):
        with transaction.atomic():
            assert lock_run(run.pk, ending=True).pk == run.pk
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] != dead
    assert len(holding(prepared(), "FOR NO KEY UPDATE OF r")) == 1


def test_a_transaction_a_send_began_and_left_idle_is_ended_by_the_servers_idle_timeout(alice: User) -> None:
    """A worker's sessions bound how long they idle inside a transaction (runs.worker.db): a worker
    stalled between a lock's round trip and its writes must not hold the run's row for good. The
    send ends with its Sync, no message after it, so the server times the session's idling."""
    run = queued_run(alice)
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('idle_in_transaction_session_timeout', '300', false)")
        cursor.execute("SELECT pg_backend_pid()")
        (stalled,) = cursor.fetchone()
    with pytest.raises(OperationalError), transaction.atomic():
        lock_run(run.pk, ending=True)  # its BEGIN and the lock in one send; then the client idles
        with psycopg.connect(_dsn(), autocommit=True) as other:
            ended = "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = %s)"
            wait_until(lambda: other.execute(ended, [stalled]).fetchone()[0], timeout=10, what="the session's end")
        lock_run(run.pk, ending=True)
    connection.close_if_unusable_or_obsolete()
    with transaction.atomic():
        assert lock_run(run.pk, ending=True).pk == run.pk  # the row is free


def test_a_table_changed_under_a_prepared_statement_is_planned_again() -> None:
    """Another connection changes the table a prepared statement reads, its answer's type too: the
    server refuses the old plan once, psycopg forgets it, and the next call prepares it anew."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE prepared_probe (id int PRIMARY KEY, value int)")
    try:
        read = "SELECT value FROM prepared_probe WHERE id = %s"
        with prepared_cursor() as cursor:
            cursor.execute("INSERT INTO prepared_probe VALUES (%s, %s)", [1, 7])
            cursor.execute(read, [1])
            assert cursor.fetchall() == [(7,)]
        assert holding(prepared(), "FROM prepared_probe WHERE id = $1")
        with psycopg.connect(_dsn(), autocommit=True) as other:
            other.execute("ALTER TABLE prepared_probe ALTER COLUMN value TYPE text")
        answers = []
        for _ in range(2):
            try:
                with prepared_cursor() as cursor:
                    cursor.execute(read, [1])
                    answers.append(cursor.fetchall())
            except Exception as exc:  # the old plan, refused by the server
                assert "cached plan must not change result type" in str(exc)
                answers.append("refused")
        assert answers == ["refused", [("7",)]], answers
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE prepared_probe")


def test_off_nothing_is_prepared(api: APIClient, alice: User) -> None:
    new_session()
    with override_settings(RUNLEDGER_PREPARED_STATEMENTS=False):
        requests(api, alice)
    assert prepared() == []


def test_a_prepared_statement_reads_times_as_the_orm_does_with_psycopg_s_own_loader(alice: User) -> None:
    """docs/design/deployment.md#prepared: in a UTC session (Django's with USE_TZ) psycopg's own
    loader — compiled, where psycopg is — gives what Django's gives: the same instant, the same zone."""
    from django.db.backends.postgresql.psycopg_any import BaseTzLoader  # type: ignore[import-untyped]

    run = running_run(alice)
    times = ("created_at", "queued_at", "started_at", "updated_at")
    sql = f"SELECT {', '.join(times)} FROM runs_run WHERE id = %s"
    with prepared_cursor() as cursor:
        loader = cursor.cursor.adapters.get_loader(psycopg.adapters.types["timestamptz"].oid, psycopg.pq.Format.TEXT)
        cursor.execute(sql, [run.pk])
        (found,) = cursor.fetchall()
    with connection.cursor() as cursor:
        cursor.execute(sql, [run.pk])
        (orm,) = cursor.fetchall()
    assert not issubclass(loader, BaseTzLoader)
    assert found == orm and all(value is not None for value in found)
    assert [value.tzinfo for value in found] == [value.tzinfo for value in orm] == [connection.timezone] * len(times)
    assert all(value.tzinfo is connection.timezone for value in found)


def test_a_connection_keeps_a_cursor_per_statement_text_and_two_of_one_text_in_a_send_each_answer() -> None:
    """A cursor sent the same text again keeps psycopg's work on it (docs/design/deployment.md#prepared);
    a text sent twice in one round trip still gives each its own rows; the kept ones are bounded."""
    one = ("SELECT %s::int + 1", [1])
    with transaction.atomic():
        assert send_pipelined([one, ("SELECT %s::int + 1", [41])], separator=";") == [[(2,)], [(42,)]]
        kept = dict(connection.connection._runledger_cursors)
        assert send_pipelined([("SELECT %s::int + 1", [9])], separator=";") == [[(10,)]]
        assert connection.connection._runledger_cursors["SELECT %s::int + 1"] == kept["SELECT %s::int + 1"]
        # Each keeps no result of its last use (a run's row may hold megabytes of documents).
        assert all(cursor.pgresult is None for cursor, _ in kept.values())
        for n in range(_KEPT_CURSORS + 5):
            assert send_pipelined([(f"SELECT {n} + %s::int", [1])], separator=";") == [[(n + 1,)]]
        assert len(connection.connection._runledger_cursors) == _KEPT_CURSORS
