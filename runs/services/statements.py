"""Statements sent together in one round trip, and the ORM's own statements built without sending
them, for the writes of a hot path (docs/design/commands.md#one-transaction)."""

from collections.abc import Sequence
from typing import Any

from django.db import connection
from django.db.models import Model, Q
from django.db.models.sql import InsertQuery, UpdateQuery

# (SQL with %s placeholders, its parameters): as for `cursor.execute`.
Statement = tuple[str, Sequence[Any]]


def send_together(*statements: tuple[str, Sequence[Any]]) -> list[list[tuple[Any, ...]]]:
    """Send `statements` in order in the open transaction: one round trip on PostgreSQL (Django's
    psycopg cursor is a ClientCursor, so `;`-joined statements go by the simple query protocol, each
    with its own snapshot), one by one elsewhere; the rows each one returned (empty for none)."""
    results: list[list[tuple[Any, ...]]] = []
    with connection.cursor() as cursor:
        if connection.vendor != "postgresql":
            for sql, params in statements:
                cursor.execute(sql, params)
                results.append(_rows(cursor))
            return results
        cursor.execute(";\n".join(sql for sql, _ in statements), [p for _, params in statements for p in params])
        results.append(_rows(cursor))
        while cursor.nextset():
            results.append(_rows(cursor))
    return results


def _rows(cursor: Any) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in cursor.fetchall()] if cursor.description is not None else []


def insert_statement(objs: Sequence[Model], *, returning_pk: bool = False) -> Statement:
    """The INSERT of new `objs` (one model, primary keys left to the database) that `save()` or
    `bulk_create` would send, their primary keys returned when `returning_pk` (`inserted`)."""
    meta = objs[0]._meta
    fields = [f for f in meta.local_concrete_fields if not f.generated and f is not meta.auto_field]
    query = InsertQuery(type(objs[0]))
    query.insert_values(fields, list(objs))
    compiler = query.get_compiler(connection=connection)
    compiler.returning_fields = [meta.pk] if returning_pk else None
    [(sql, params)] = compiler.as_sql()
    return sql, params


def inserted(objs: Sequence[Model], rows: Sequence[tuple[Any, ...]]) -> None:
    """Mark `objs` saved, with the primary keys their `insert_statement(returning_pk=True)` returned."""
    for obj, (pk,) in zip(objs, rows, strict=True):
        obj.pk = pk
        obj._state.adding = False
        obj._state.db = connection.alias


def update_statement(obj: Model, fields: Sequence[str]) -> Statement:
    """The UPDATE of `fields` of the saved `obj` that `obj.save(update_fields=fields)` would send."""
    chosen = [f for f in obj._meta.local_concrete_fields if f.name in fields or f.attname in fields]
    assert len(chosen) == len(set(fields)), fields
    query = UpdateQuery(type(obj))
    query.add_update_values({f.name: f.pre_save(obj, False) for f in chosen})
    query.add_q(Q(pk=obj.pk))
    return query.get_compiler(connection=connection).as_sql()
