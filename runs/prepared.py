"""Hot statements sent prepared on PostgreSQL (docs/design/deployment.md#prepared): parsed and
planned once per connection, then each call sends only its values.

Django's cursor binds values on the client and sends each statement whole, so the server parses and
plans it every time. These cursors bind them on the server and ask psycopg to prepare the statement
(protocol-level Parse/Bind/Execute, which PgBouncer 1.21+ also carries in transaction pooling with
`max_prepared_statements`). psycopg keeps the names per connection: a new or reconnected connection
starts with none, and a ROLLBACK, DROP, ALTER or DISCARD ALL on it deallocates them all, to be
prepared again at their next use.
"""

import contextlib
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import cache
from typing import Any

from django.db import connections
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from django.utils.asyncio import async_unsafe

from runs.conf import conf

# What joins the statements of a send in the log: the statement pins split a captured send on it.
SEPARATOR = ";\n"

# psycopg prepares nothing while a connection's threshold is None (Django's default); with this one
# it prepares only what asks (Django's own cursors bind on the client and never prepare).
_ONLY_WHEN_ASKED = 2**31 - 1


def preparing(alias: str = "default") -> bool:
    """Whether `alias`'s hot statements go prepared: PostgreSQL, unless RUNLEDGER_PREPARED_STATEMENTS is off."""
    return connections[alias].vendor == "postgresql" and conf.PREPARED_STATEMENTS


def pipelining(alias: str = "default") -> bool:
    """Whether `send_pipelined` may be used: `preparing`, with a libpq that has pipeline mode (14+)."""
    return preparing(alias) and _has_pipeline()


@cache
def _has_pipeline() -> bool:
    from psycopg import capabilities

    return capabilities.has_pipeline()


@async_unsafe  # as Django's own `cursor()`
def prepared_cursor(alias: str = "default") -> CursorWrapper:
    """A cursor of `alias`'s connection whose statements are prepared when `preparing`; Django's own
    otherwise. Used as Django's: its statements are logged and captured the same way."""
    connection = connections[alias]
    if not preparing(alias):
        return connection.cursor()
    # Django's `cursor()` with this cursor in place of the one it would make (and close again).
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    with connection.wrap_database_errors:
        wrapper: CursorWrapper = connection._prepare_cursor(_new_cursor(alias))  # type: ignore[attr-defined]
    return wrapper


def send_pipelined(
    statements: Sequence[tuple[str, Sequence[Any] | Mapping[str, Any]]],
    *,
    separator: str,
    alias: str = "default",
    commit: bool = False,
) -> list[list[tuple[Any, ...]]]:
    """Send `statements` prepared, in order, in one round trip (psycopg's pipeline mode): each runs
    once the one before has, with a snapshot of its own. The rows each one returned (empty for
    none). The first statements of a transaction go with its BEGIN; with `commit`, its COMMIT goes
    last (Django's own then finds nothing to commit). Logged as one query, its statements joined by
    `separator` (the BEGIN and COMMIT too). Only where `pipelining`."""
    from psycopg.pq import ExecStatus

    connection = connections[alias]
    with connection.cursor() as wrapper:
        wrapper.cursor.close()
        raw = connection.connection
        begin = _begin_here(raw)
        taken: set[int] = set()
        beginning = _kept_cursor(alias, raw, begin, taken) if begin else None
        sent = [_kept_cursor(alias, raw, sql, taken) for sql, _ in statements]
        committing = _kept_cursor(alias, raw, "COMMIT", taken) if commit else None
        logged: AbstractContextManager[Any] = nullcontext()
        if isinstance(wrapper, CursorDebugWrapper):
            ops: Any = connection.ops
            shown = separator.join(
                [
                    *([begin] if begin else []),
                    *(str(ops.compose_sql(sql, params)) for sql, params in statements),
                    *(["COMMIT"] if commit else []),
                ]
            )
            logged = wrapper.debug_sql(shown)
        with logged, connection.wrap_database_errors:
            with forgetting_on_error(raw), _beginning(raw, begin), _pipeline(raw):
                if beginning is not None:
                    beginning[0].execute(beginning[1], prepare=False)
                for (cursor, text), (_, params) in zip(sent, statements, strict=True):
                    cursor.execute(text, params)
                if committing is not None:
                    committing[0].execute(committing[1], prepare=False)
            found: list[list[tuple[Any, ...]]] = []
            for cursor, _ in sent:
                result = cursor.pgresult
                found.append(cursor.fetchall() if result is not None and result.status == ExecStatus.TUPLES_OK else [])
                _let_go(cursor)
            for ended in (beginning, committing):
                if ended is not None:
                    _let_go(ended[0])
    return found


def _pipeline(raw: Any) -> AbstractContextManager[Any]:
    """psycopg's pipeline on `raw`, ended by its Sync alone. psycopg's own sends a Flush after the
    Sync, and a server that reads any message after its ReadyForQuery stops timing the session's
    idling: `idle_in_transaction_session_timeout` would never end a transaction that a pipeline
    began and a stalled client left open (a worker's run lock, `runs.worker.db`)."""
    if raw._pipeline is None:
        raw._pipeline = _synced_pipeline_class()(raw)  # `pipeline()` takes the one it finds
    pipeline: AbstractContextManager[Any] = raw.pipeline()
    return pipeline


@cache
def _synced_pipeline_class() -> type[Any]:
    from psycopg import Pipeline

    class SyncedPipeline(Pipeline):
        def _exit_gen(self) -> Any:
            try:
                self._enqueue_sync()
                yield from self._communicate_gen()
            finally:
                # The Sync flushes the server's answers: fetched without asking for a Flush.
                yield from self._fetch_gen(flush=False)

    return SyncedPipeline


def _begin_here(raw: Any) -> str | None:
    """The BEGIN psycopg would send before the next statement (its own text: with the isolation level
    and access mode the connection is set to), for the pipeline to send first; None where nothing
    is to begin (autocommit, or a transaction begun). psycopg sends its own in a round trip of its
    own: it must know that the transaction has begun before it sends more."""
    from psycopg.pq import TransactionStatus

    if raw.autocommit or raw.pgconn.transaction_status != TransactionStatus.IDLE:
        return None
    text: str = raw._get_tx_start_command().decode()
    return text


@contextmanager
def _beginning(raw: Any, begin: str | None) -> Iterator[None]:
    """With `begin`, psycopg sends no BEGIN of its own meanwhile (its flag, which it reads before a
    statement: the public setter would sync the pipeline to change it); after, its state is as after
    its own BEGIN (the transaction open, or failed, and autocommit off)."""
    if begin is None:
        yield
        return
    raw._autocommit = True
    try:
        yield
    finally:
        raw._autocommit = False


def _let_go(cursor: Any) -> None:
    # A kept cursor would hold its last result (a run's row: documents up to the body limit) until its
    # next use: dropped as its next execute would drop it (psycopg's own reset, and its converter's).
    cursor._reset()
    cursor._tx.set_pgresult(None)


# The cursors a connection keeps, one per statement text sent through `send_pipelined`, the least
# recently used closed beyond this many: a cursor sent the same text object again keeps what psycopg
# worked out for it (the dumpers of its values' types, its adapters), ~10 µs of Python a statement.
_KEPT_CURSORS = 64


def _kept_cursor(alias: str, raw: Any, sql: str, taken: set[int]) -> tuple[Any, str]:
    """The cursor `alias`'s connection (psycopg's: `raw`) keeps for `sql`, with the text object to
    send it with (the one it was first sent, so that psycopg knows it again); a new one for a text
    already `taken` by the same send (each statement of a pipeline has its own result)."""
    # On the connection itself: a new or reconnected connection starts with none, and they go with it.
    kept: OrderedDict[str, tuple[Any, str]] | None = getattr(raw, "_runledger_cursors", None)
    if kept is None:
        kept = raw._runledger_cursors = OrderedDict()
    found = kept.get(sql)
    if found is None:
        found = kept[sql] = (_new_cursor(alias), sql)
        if len(kept) > _KEPT_CURSORS:
            kept.popitem(last=False)[1][0].close()
    elif id(found[0]) in taken:
        found = (_new_cursor(alias), sql)
    else:
        kept.move_to_end(sql)
    taken.add(id(found[0]))
    return found


def _new_cursor(alias: str) -> Any:
    from django.db.backends.postgresql.base import TIMESTAMPTZ_OID  # type: ignore[attr-defined]
    from django.db.backends.postgresql.psycopg_any import register_tzloader  # type: ignore[import-untyped]
    from psycopg.pq import Format
    from psycopg.types.datetime import TimestamptzLoader

    connection = connections[alias]
    raw = connection.connection
    if raw.prepare_threshold is None:
        raw.prepare_threshold = _ONLY_WHEN_ASKED
    cursor = _preparing_class()(raw)
    cursor.shown_by = connection.ops
    if connection.timezone is raw.info.timezone:
        # Django's loader is psycopg's in Python with the time zone set again: where psycopg's own
        # gives that zone already (a UTC session, as Django's is with USE_TZ), psycopg's compiled
        # one reads the same times, ~4 µs less each.
        cursor.adapters.register_loader(TIMESTAMPTZ_OID, TimestamptzLoader)
    elif connection.timezone != raw.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT).timezone:
        # As Django's create_cursor: a time zone of the cursor's own when the connection's differs.
        register_tzloader(connection.timezone, cursor)
    return cursor


@contextmanager
def forgetting_on_error(raw: Any) -> Iterator[None]:
    """Forget every statement prepared on `raw` when what runs inside fails. psycopg forgets them at
    a rollback, but a prepared statement that fails outside a transaction stays in use: the server
    refuses a plan whose answer's columns changed ("cached plan must not change result type") or a
    name it no longer holds (a DISCARD ALL) every time again. Deallocated at once when the
    connection is idle; in a failed transaction, by the rollback that must come first."""
    try:
        yield
    except Exception:
        from psycopg.pq import TransactionStatus

        manager = raw._prepared
        manager.clear()
        # Not on a broken connection (its status is not IDLE), which is dropped anyway; and a failed
        # DEALLOCATE loses nothing: the names forgotten here are never used again.
        if raw.pgconn.transaction_status == TransactionStatus.IDLE:
            with contextlib.suppress(Exception), raw.lock:
                raw.wait(manager.maintain_gen(raw))
        raise


@cache
def _preparing_class() -> type[Any]:
    from django.db.backends.postgresql.base import ServerBindingCursor  # type: ignore[attr-defined]

    class PreparingCursor(ServerBindingCursor):
        shown_by: Any

        def execute(self, query: Any, params: Any = None, *, prepare: bool | None = True, **kwargs: Any) -> Any:
            with forgetting_on_error(self.connection):
                done = super().execute(query, params, prepare=prepare, **kwargs)
            # A prepared execution keeps no text, and Django logs (and tests capture) a statement
            # by the text its own cursor sent: that text, merged only when read.
            self._query = _Shown(self.shown_by, query, params)
            return done

    return PreparingCursor


class _Shown:
    """What Django reads of a cursor's last statement (`_query.query`): its text with the values
    merged in, as Django's client-binding cursor sends it."""

    __slots__ = ("_ops", "_params", "_sql")

    def __init__(self, ops: Any, sql: str, params: Any) -> None:
        self._ops, self._sql, self._params = ops, sql, params

    @property
    def query(self) -> bytes:
        return str(self._ops.compose_sql(self._sql, self._params)).encode()
