"""Statements written plainly and sent together: the writes of a command in one round trip, the
last ones with its COMMIT (docs/design/commands.md#one-transaction). Each statement is built from the model's own fields, so
the values go to the database as the ORM would send them, and rows come back as the ORM reads them."""

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cache
from typing import Any, TypeVar

from django.db import connection, connections
from django.db.models import Field, Model

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
    head, fields = _insert_head(model, keyed, connection.vendor)
    given = {_field(model, name).attname: value for name, value in (computed or {}).items()}
    row = "(" + ", ".join(given[f.attname][0] if f.attname in given else "%s" for f in fields) + ")"
    db = _wrapper()
    params = [
        part
        for obj in objs
        for f in fields
        for part in (given[f.attname][1] if f.attname in given else [_saved(f, obj, db)])
    ]
    tail = f" RETURNING {_q(model._meta.pk.column)}" if returning and model._meta.pk is not None else ""
    return f"{head} VALUES {', '.join([row] * len(objs))}{tail}", params


def inserted(objs: Sequence[Model], rows: Sequence[tuple[Any, ...]]) -> None:
    """Mark `objs` saved, with the keys their `insert(returning=True)` returned."""
    for obj, (pk,) in zip(objs, rows, strict=True):
        obj.pk = pk
        obj._state.adding = False
        obj._state.db = connection.alias


@cache
def _insert_head(model: type[Model], keyed: bool, vendor: str) -> tuple[str, list["Field[Any, Any]"]]:
    fields = [f for f in model._meta.concrete_fields if keyed or not f.primary_key]
    return f"INSERT INTO {_q(model._meta.db_table)} ({', '.join(_q(f.column) for f in fields)})", fields


def update(obj: Model, fields: Iterable[str]) -> Statement:
    """The UPDATE of `obj`'s `fields` (names, as `save(update_fields=)` takes them), by its key."""
    sql, changed = _update_sql(type(obj), tuple(fields), connection.vendor)
    pk = obj._meta.pk
    assert pk is not None
    db = _wrapper()
    return sql, [*(_saved(f, obj, db) for f in changed), _saved(pk, obj, db)]


@cache
def _update_sql(model: type[Model], names: tuple[str, ...], vendor: str) -> tuple[str, list["Field[Any, Any]"]]:
    changed = [_field(model, name) for name in names]
    pk = model._meta.pk
    assert pk is not None
    sets = ", ".join(f"{_q(f.column)} = %s" for f in changed)
    return f"UPDATE {_q(model._meta.db_table)} SET {sets} WHERE {_q(pk.column)} = %s", changed


def _field(model: type[Model], name: str) -> "Field[Any, Any]":
    field = model._meta.get_field(name)
    assert isinstance(field, Field), name
    return field


def _saved(field: "Field[Any, Any]", obj: Model, db: Any) -> Any:
    return field.get_db_prep_save(getattr(obj, field.attname), db)


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
