"""Statements written plainly and sent together: the writes of a command in one round trip, the
last ones with its COMMIT (docs/design/commands.md#one-transaction). Each statement is built from the model's own fields, so
the values go to the database as the ORM would send them, and rows come back as the ORM reads them."""

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from functools import cache
from typing import Any, TypeVar
from uuid import UUID

from django.db import connection, connections
from django.db.models import (
    BigIntegerField,
    CharField,
    DateTimeField,
    Field,
    ForeignKey,
    IntegerField,
    Model,
    PositiveBigIntegerField,
    PositiveIntegerField,
    PositiveSmallIntegerField,
    SmallIntegerField,
    TextField,
    UUIDField,
)

from runs.prepared import SEPARATOR, pipelining, send_pipelined

M = TypeVar("M", bound=Model)

Statement = tuple[str, Sequence[Any]]
Rows = list[tuple[Any, ...]]


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
        from psycopg.pq import ExecStatus

        cursor.execute(SEPARATOR.join(sql for sql, _ in statements), [p for _, params in statements for p in params])
        while True:
            # Rows or none by the result's status: `description` would build an object per column.
            result = cursor.pgresult
            returned = result is not None and result.status == ExecStatus.TUPLES_OK
            found.append(list(cursor.fetchall()) if returned else [])
            if not cursor.nextset():
                break
    assert len(found) == len(statements), (len(found), len(statements))
    return found


def send_prepared(*statements: tuple[str, Sequence[Any]]) -> list[list[tuple[Any, ...]]]:
    """As `send_together`, each statement prepared (runs.prepared) where statements go prepared:
    still one round trip, and each statement still with its own snapshot, taken once the one before
    has run."""
    if not pipelining(connection.alias):
        return send_together(*statements)
    if hold := _hold():
        hold.send()
    return send_pipelined(statements, separator=SEPARATOR, alias=connection.alias)


def send_last(*statements: Statement, then: Callable[[list[Rows]], None] | None = None) -> None:
    """Send `statements` (`send_prepared`) and give `then` the rows each returned; inside `holding`,
    not before the transaction's next statement, or its COMMIT: the last writes of a command go with
    it in one round trip."""
    if hold := _hold():
        hold.held.append((statements, then))
        return
    found = send_prepared(*statements)
    if then is not None:
        then(found)


@contextmanager
def holding() -> Iterator[None]:
    """A durable transaction's body whose writes sent with `send_last` are held, then sent with the
    next statement's round trip, or with the COMMIT when the block ends (PostgreSQL, pipelining:
    one round trip for a command's writes, its notification and its commit; elsewhere they go at
    once). Only around the whole body of `transaction.atomic(durable=True)`, nothing after it: the
    transaction is committed when the block ends. What fails, the COMMIT included, raises from here,
    and the atomic block rolls back as ever; its on_commit hooks run only after the COMMIT."""
    if not pipelining(connection.alias):
        yield
        return
    hold = _Hold()
    with connection.execute_wrapper(hold):
        yield
    # In a test's transaction (an atomic block around this one) nothing is committed here.
    hold.send(commit=len(connection.atomic_blocks) == 1)


class _Hold:
    """The writes `holding` holds; sent before any other statement of the connection (a Django
    cursor's, by its execute wrapper; `send_prepared`'s, by itself)."""

    def __init__(self) -> None:
        self.held: list[tuple[Sequence[Statement], Callable[[list[Rows]], None] | None]] = []

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        self.send()
        return execute(sql, params, many, context)

    def send(self, *, commit: bool = False) -> None:
        held, self.held = self.held, []
        if not held:
            return
        statements = [statement for sent, _ in held for statement in sent]
        found = send_pipelined(statements, separator=SEPARATOR, alias=connection.alias, commit=commit)
        for sent, then in held:
            if then is not None:
                then(found[: len(sent)])
            found = found[len(sent) :]


def _hold() -> "_Hold | None":
    return next((wrapper for wrapper in connection.execute_wrappers if isinstance(wrapper, _Hold)), None)


def _q(name: str) -> str:
    return connection.ops.quote_name(name)


def insert(
    objs: Sequence[Model], *, computed: Mapping[str, Statement] | None = None, returning: bool = False
) -> Statement:
    """One INSERT of `objs` (of one model, their primary keys set or left to the database), every
    concrete field but an automatic key; the fields named in `computed` take its SQL expression,
    the same in each row, instead of their value. `returning`: the keys the database gave them come
    back (`inserted`)."""
    model = type(objs[0])
    keyed = model._meta.pk is not None and getattr(objs[0], model._meta.pk.attname) is not None
    db = _wrapper()
    head, fields, tail = _insert_head(model, keyed, db.vendor)
    given = {_field(model, name).attname: value for name, value in (computed or {}).items()}
    row = "(" + ", ".join(given[f.attname][0] if f.attname in given else "%s" for f, _ in fields) + ")"
    params = [
        part
        for obj in objs
        for f, saved in fields
        for part in (given[f.attname][1] if f.attname in given else [saved(obj, db)])
    ]
    return f"{head} VALUES {', '.join([row] * len(objs))}{tail if returning else ''}", params


def inserted(objs: Sequence[Model], rows: Sequence[tuple[Any, ...]]) -> None:
    """Mark `objs` saved, with the keys their `insert(returning=True)` returned."""
    for obj, (pk,) in zip(objs, rows, strict=True):
        obj.pk = pk
        obj._state.adding = False
        obj._state.db = connection.alias


@cache
def _insert_head(model: type[Model], keyed: bool, vendor: str) -> tuple[str, list["_Saving"], str]:
    """The INSERT's text up to its values, its fields with how each value is saved, and the
    RETURNING of its key."""
    fields = [f for f in model._meta.concrete_fields if keyed or not f.primary_key]
    head = f"INSERT INTO {_q(model._meta.db_table)} ({', '.join(_q(f.column) for f in fields)})"
    tail = f" RETURNING {_q(model._meta.pk.column)}" if model._meta.pk is not None else ""
    return head, [(f, _saver(f)) for f in fields], tail


def update(obj: Model, fields: Iterable[str]) -> Statement:
    """The UPDATE of `obj`'s `fields` (names, as `save(update_fields=)` takes them), by its key."""
    db = _wrapper()
    sql, changed = _update_sql(type(obj), tuple(fields), db.vendor)
    return sql, [saved(obj, db) for saved in changed]


@cache
def _update_sql(model: type[Model], names: tuple[str, ...], vendor: str) -> tuple[str, list["_Saved"]]:
    """The UPDATE's text, and how each of its values is saved: its fields', then its key's."""
    changed = [_field(model, name) for name in names]
    pk = model._meta.pk
    assert pk is not None
    sets = ", ".join(f"{_q(f.column)} = %s" for f in changed)
    sql = f"UPDATE {_q(model._meta.db_table)} SET {sets} WHERE {_q(pk.column)} = %s"
    return sql, [_saver(f) for f in [*changed, pk]]


def _field(model: type[Model], name: str) -> "Field[Any, Any]":
    field = model._meta.get_field(name)
    assert isinstance(field, Field), name
    return field


# How a field's value of an object is saved: `get_db_prep_save`'s answer, given the object and the
# connection.
_Saved = Callable[[Model, Any], Any]
_Saving = tuple["Field[Any, Any]", _Saved]
_INTEGERS = (
    IntegerField,
    BigIntegerField,
    SmallIntegerField,
    PositiveIntegerField,
    PositiveBigIntegerField,
    PositiveSmallIntegerField,
)


def _saver(field: "Field[Any, Any]") -> _Saved:
    """`field.get_db_prep_save` of the object's value; for a value of the one type this kind of field
    is given (an aware time, a whole number, text, a UUID), what Django's layers make of it without
    their calls, which are most of a statement's Python: the value as it is, adapted by the backend
    where they adapt it (tests/core/test_statements.py holds the two to each other)."""
    attname, generic = field.attname, field.get_db_prep_save
    target = field.target_field if type(field) is ForeignKey else field
    kind = type(target)
    if kind in (CharField, TextField) and target is field:  # a key's "" is None: Django's way
        return lambda obj, db: value if isinstance(value := getattr(obj, attname), str) else generic(value, db)
    if kind in _INTEGERS:
        internal = target.get_internal_type()

        def integer(obj: Model, db: Any) -> Any:
            value = getattr(obj, attname)
            return db.ops.adapt_integerfield_value(value, internal) if type(value) is int else generic(value, db)

        return integer
    if kind is DateTimeField and target is field:
        return lambda obj, db: (
            db.ops.adapt_datetimefield_value(value)
            if type(value := getattr(obj, attname)) is datetime and value.utcoffset() is not None
            else generic(value, db)
        )
    if kind is UUIDField:
        return lambda obj, db: (
            (value if db.features.has_native_uuid_field else value.hex)
            if type(value := getattr(obj, attname)) is UUID
            else generic(value, db)
        )
    return lambda obj, db: generic(getattr(obj, attname), db)


def _wrapper() -> Any:
    # The connection itself, looked up once for a statement's values: each field's preparation asks
    # it for its operations and features, and every ask through `django.db.connection` looks it up
    # again (a context-local read).
    return connections[connection.alias]


def columns(model: type[Model], alias: str = "") -> str:
    """Every concrete column of `model`, in field order (as `from_row` reads them)."""
    return _columns(model, alias, connection.vendor)


@cache
def _columns(model: type[Model], alias: str, vendor: str) -> str:
    prefix = f"{_q(alias)}." if alias else ""
    return ", ".join(prefix + _q(f.column) for f in model._meta.concrete_fields)


def from_row(model: type[M], values: Sequence[Any]) -> M:
    """The instance of `model` that a row of its `columns` holds, converted as the ORM converts them."""
    names, converters = _reading(model, connection.vendor)
    converted = list(values)
    assert len(converted) == len(names), (model, len(converted))
    for i, expression, found in converters:
        for converter in found:
            converted[i] = converter(converted[i], expression, connection)
    return model.from_db(connection.alias, names, converted)


@cache
def _reading(model: type[Model], vendor: str) -> tuple[list[str], list[tuple[int, Any, list[Callable[..., Any]]]]]:
    """The attribute names of `model`'s `columns`, and the ORM's converters of each that has some."""
    converters = []
    for i, field in enumerate(model._meta.concrete_fields):
        expression = field.get_col(model._meta.db_table)
        found = [*connection.ops.get_db_converters(expression), *field.get_db_converters(connection)]  # type: ignore[attr-defined]
        if found:
            converters.append((i, expression, found))
    return [f.attname for f in model._meta.concrete_fields], converters
