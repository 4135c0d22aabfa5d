"""Statements written plainly and sent together: the writes of a command in one round trip
(docs/design/commands.md#one-transaction). Each statement is built from the model's own fields, so
the values go to the database as the ORM would send them, and rows come back as the ORM reads them."""

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache
from typing import Any, TypeVar

from django.db import connection
from django.db.models import Field, Model

M = TypeVar("M", bound=Model)

Statement = tuple[str, Sequence[Any]]

# What joins the statements of a send: the statement pins split a captured send on it.
SEPARATOR = ";\n"


def send_together(*statements: tuple[str, Sequence[Any]]) -> list[list[tuple[Any, ...]]]:
    """Send `statements` in order in the open transaction: one round trip on PostgreSQL (Django's
    psycopg cursor is a ClientCursor, so `;`-joined statements go by the simple query protocol, each
    with its own snapshot), one by one elsewhere; the rows each one returned (empty for none)."""
    found: list[list[tuple[Any, ...]]] = []
    with connection.cursor() as cursor:
        if connection.vendor != "postgresql":
            for sql, params in statements:
                cursor.execute(sql, params)
                found.append(list(cursor.fetchall()) if cursor.description is not None else [])
            return found
        cursor.execute(SEPARATOR.join(sql for sql, _ in statements), [p for _, params in statements for p in params])
        while True:
            found.append(list(cursor.fetchall()) if cursor.description is not None else [])
            if not cursor.nextset():
                break
    assert len(found) == len(statements), (len(found), len(statements))
    return found


def _q(name: str) -> str:
    return connection.ops.quote_name(name)


def insert(objs: Sequence[Model], *, computed: Mapping[str, Statement] | None = None) -> Statement:
    """One INSERT of `objs` (of one model, their primary keys set or left to the database), every
    concrete field but an automatic key; the fields named in `computed` take its SQL expression,
    the same in each row, instead of their value."""
    model = type(objs[0])
    fields = [f for f in model._meta.concrete_fields if not (f.primary_key and getattr(objs[0], f.attname) is None)]
    given = {_field(model, name).attname: value for name, value in (computed or {}).items()}
    row = "(" + ", ".join(given[f.attname][0] if f.attname in given else "%s" for f in fields) + ")"
    sql = (
        f"INSERT INTO {_q(model._meta.db_table)} ({', '.join(_q(f.column) for f in fields)}) "
        f"VALUES {', '.join([row] * len(objs))}"
    )
    params = [
        part
        for obj in objs
        for f in fields
        for part in (given[f.attname][1] if f.attname in given else [_saved(f, obj)])
    ]
    return sql, params


def update(obj: Model, fields: Iterable[str]) -> Statement:
    """The UPDATE of `obj`'s `fields` (names, as `save(update_fields=)` takes them), by its key."""
    meta = obj._meta
    changed = [_field(type(obj), name) for name in fields]
    sets = ", ".join(f"{_q(f.column)} = %s" for f in changed)
    params = [_saved(f, obj) for f in changed]
    pk = meta.pk
    assert pk is not None
    return f"UPDATE {_q(meta.db_table)} SET {sets} WHERE {_q(pk.column)} = %s", [*params, _saved(pk, obj)]


def _field(model: type[Model], name: str) -> "Field[Any, Any]":
    field = model._meta.get_field(name)
    assert isinstance(field, Field), name
    return field


def _saved(field: "Field[Any, Any]", obj: Model) -> Any:
    return field.get_db_prep_save(getattr(obj, field.attname), connection)


def columns(model: type[Model], alias: str = "") -> str:
    """Every concrete column of `model`, in field order (as `from_row` reads them)."""
    prefix = f"{_q(alias)}." if alias else ""
    return ", ".join(prefix + _q(f.column) for f in model._meta.concrete_fields)


def from_row(model: type[M], values: Sequence[Any]) -> M:
    """The instance of `model` that a row of its `columns` holds, converted as the ORM converts them."""
    converted = [convert(value) for convert, value in zip(_converters(model, connection.vendor), values, strict=True)]
    return model.from_db(connection.alias, [f.attname for f in model._meta.concrete_fields], converted)


@cache
def _converters(model: type[Model], vendor: str) -> list[Callable[[Any], Any]]:
    def one(field: "Field[Any, Any]") -> Callable[[Any], Any]:
        expression = field.get_col(model._meta.db_table)
        found = [*connection.ops.get_db_converters(expression), *field.get_db_converters(connection)]  # type: ignore[attr-defined]

        def convert(value: Any) -> Any:
            for converter in found:
                value = converter(value, expression, connection)
            return value

        return convert

    return [one(f) for f in model._meta.concrete_fields]
