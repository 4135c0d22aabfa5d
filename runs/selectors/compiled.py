"""Hot reads compiled once per process (docs/design/api.md#hot-reads): a QuerySet's SQL built the first
time a read runs on a database, then sent with each call's own parameters and its rows made into
objects as the ORM makes them — the same statement and the same objects, without building and
compiling the query again on every request.
"""

import re
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from django.db import connections, router
from django.db.models import Field, Model, QuerySet
from django.db.models.query import MAX_GET_RESULTS, get_related_populators  # type: ignore[attr-defined]

from runs.prepared import prepared_cursor

M = TypeVar("M", bound=Model)


def as_first(queryset: QuerySet[M]) -> QuerySet[M]:
    """What `queryset.first()` sends: its order (by pk when it has none), one row."""
    return (queryset if queryset.ordered else queryset.order_by("pk"))[:1]


def as_get(queryset: QuerySet[M]) -> QuerySet[M]:
    """What `queryset.get()` sends: no order, at most MAX_GET_RESULTS rows."""
    return queryset.order_by()[:MAX_GET_RESULTS]


@dataclass(frozen=True)
class Param:
    """A value the statement compares with `field`, prepared as the field's lookup prepares it
    (a UUID is hex on SQLite, a time UTC text there). `samples`: two values, each taken by no other
    parameter of the statement, by which the compiled parameters are told apart from constants."""

    field: "Field[Any, Any]"
    samples: tuple[Any, Any]

    def prepare(self, value: Any, connection: Any) -> Any:
        return self.field.get_db_prep_value(self.field.get_prep_value(value), connection, prepared=True)


@dataclass(frozen=True)
class _Compiled:
    sql: str
    params: tuple[Any, ...]
    slots: tuple[tuple[str, tuple[int, ...]], ...]
    # What the ORM's iterator takes from the compiler that made `sql`: the columns, which of them
    # are the model's, the related objects' and the annotations.
    query: Any
    columns: tuple[Any, ...]
    model: type[Model]
    names: tuple[str, ...]
    span: slice
    related: tuple[Any, ...]
    annotations: tuple[tuple[str, int], ...]


class CompiledRead(Generic[M]):
    """A read built by `build(*shape, **values)`, compiled once per database alias, vendor and
    `shape` (what changes the statement's text: a LIMIT, a column more), its `values` (one per
    `Param`) sent as parameters. `inline`: on PostgreSQL its other values, the queryset's constants,
    are written into its text as literals, so that the server plans it once per connection: a status
    compared with a partial index's predicate as a parameter is planned again at every execution
    (the generic plan cannot prove the predicate, so the server keeps to custom plans)."""

    def __init__(
        self, model: type[M], build: Callable[..., QuerySet[M]], *, inline: bool = False, **params: Param
    ) -> None:
        self.model, self.build, self.params, self.inline = model, build, params, inline
        self._compiled: dict[tuple[str, str, Hashable], _Compiled] = {}
        self._local = threading.local()

    def objects(self, *shape: Hashable, **values: Any) -> list[M]:
        """The objects the QuerySet would give (`Model.from_db`, select_related's objects set,
        annotations as attributes), from the one statement."""
        alias = router.db_for_read(self.model)
        entry = self._entry(alias, shape)
        sql, params = self._statement(alias, entry, values)
        with prepared_cursor(alias) as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        return self._objects(alias, entry, rows)

    def statement(self, *shape: Hashable, **values: Any) -> tuple[str, list[Any]]:
        """The statement of `shape` with `values`, for a caller that sends it with others
        (runs.services.statements.send_prepared) and makes its objects with `from_rows`."""
        alias = router.db_for_read(self.model)
        return self._statement(alias, self._entry(alias, shape), values)

    def from_rows(self, rows: list[Any], *shape: Hashable) -> list[M]:
        """The objects of the rows `statement(*shape, ...)` read."""
        alias = router.db_for_read(self.model)
        return self._objects(alias, self._entry(alias, shape), rows)

    def _objects(self, alias: str, entry: _Compiled, rows: list[Any]) -> list[M]:
        compiler, converters = self._converters(alias, entry)
        if converters:
            rows = list(compiler.apply_converters(rows, converters))
        return [self._object(alias, entry, row) for row in rows]

    def _converters(self, alias: str, entry: _Compiled) -> tuple[Any, list[Any]]:
        """The compiler and converters the ORM would apply to `entry`'s rows: asked of this thread's
        connection, as the ORM asks them of its own, once per connection (kept per thread)."""
        connection = connections[alias]
        kept: dict[int, tuple[Any, Any, list[Any]]] = self._local.__dict__.setdefault("kept", {})
        found = kept.get(id(entry))
        if found is None or found[0] is not connection:
            compiler = entry.query.get_compiler(using=alias)
            found = kept[id(entry)] = (connection, compiler, compiler.get_converters(entry.columns))
        return found[1], found[2]

    def _object(self, alias: str, entry: _Compiled, row: Any) -> M:
        obj: M = entry.model.from_db(alias, entry.names, row[entry.span])  # type: ignore[assignment]
        for populator in entry.related:
            populator.populate(row, obj)
        for name, position in entry.annotations:
            setattr(obj, name, row[position])
        return obj

    def fresh_sql(self, *shape: Hashable) -> tuple[str, tuple[Any, ...]]:
        """The statement the QuerySet compiles to now (its constants inlined where `inline` says),
        with the first samples: what a test holds the kept text to, so that a changed model cannot
        leave it stale."""
        entry = self._make(router.db_for_read(self.model), shape)
        return entry.sql, entry.params

    def kept_sql(self, *shape: Hashable) -> tuple[str, tuple[Any, ...]]:
        """The statement kept for `shape`, with the first samples."""
        entry = self._entry(router.db_for_read(self.model), shape)
        return entry.sql, entry.params

    def _statement(self, alias: str, entry: _Compiled, values: dict[str, Any]) -> tuple[str, list[Any]]:
        if values.keys() != self.params.keys():
            raise TypeError(f"expected the values {sorted(self.params)}, got {sorted(values)}")
        connection = connections[alias]
        params = list(entry.params)
        for name, positions in entry.slots:
            prepared = self.params[name].prepare(values[name], connection)
            for position in positions:
                params[position] = prepared
        return entry.sql, params

    def _entry(self, alias: str, shape: tuple[Hashable, ...]) -> _Compiled:
        key = (alias, connections[alias].vendor, shape)
        entry = self._compiled.get(key)
        if entry is None:
            # Two threads may both compile it the first time: the same text either way.
            entry = self._compiled[key] = self._make(alias, shape)
        return entry

    def _compile(self, alias: str, shape: tuple[Hashable, ...], sample: int) -> Any:
        values = {name: param.samples[sample] for name, param in self.params.items()}
        return self.build(*shape, **values).query.get_compiler(using=alias)

    def _make(self, alias: str, shape: tuple[Hashable, ...]) -> _Compiled:
        connection = connections[alias]
        compilers = [self._compile(alias, shape, sample) for sample in (0, 1)]
        (sql, first), (other_sql, second) = (compiler.as_sql() for compiler in compilers)
        if sql != other_sql or len(first) != len(second):
            raise ValueError(f"{self.build.__qualname__}: its values change the statement's text")
        changed = {i for i, (a, b) in enumerate(zip(first, second, strict=True)) if a != b}
        slots = []
        for name, param in self.params.items():
            ours = tuple(
                i
                for i in changed
                if first[i] == param.prepare(param.samples[0], connection)
                and second[i] == param.prepare(param.samples[1], connection)
            )
            if not ours:
                raise ValueError(f"{self.build.__qualname__}: no parameter takes the value of {name!r}")
            slots.append((name, ours))
        claimed = [i for _, positions in slots for i in positions]
        if len(claimed) != len(set(claimed)) or changed != set(claimed):
            raise ValueError(f"{self.build.__qualname__}: its parameters are not told apart by their samples")
        if self.inline and connection.vendor == "postgresql":
            sql, first, slots = _inlined(connection, sql, first, slots)
        compiler = compilers[0]
        select, klass_info = compiler.select, compiler.klass_info
        start, end = klass_info["select_fields"][0], klass_info["select_fields"][-1] + 1
        return _Compiled(
            sql=sql,
            params=tuple(first),
            slots=tuple(slots),
            query=compiler.query,
            columns=tuple(column[0] for column in select[0 : compiler.col_count]),
            model=klass_info["model"],
            names=tuple(column[0].target.attname for column in select[start:end]),
            span=slice(start, end),
            related=tuple(get_related_populators(klass_info, select, alias)),
            annotations=tuple(compiler.annotation_col_map.items()),
        )


def _inlined(
    connection: Any, sql: str, params: Sequence[Any], slots: list[tuple[str, tuple[int, ...]]]
) -> tuple[str, list[Any], list[tuple[str, tuple[int, ...]]]]:
    """`sql` with each of its `params` that no slot takes written in as a literal (psycopg's, as its
    client-side binding writes it), and the slots' positions among the parameters left."""
    from psycopg.sql import Literal

    connection.ensure_connection()
    taken = {position for _, positions in slots for position in positions}
    kept: dict[int, int] = {}
    parts: list[str] = []
    position = 0
    for part in re.split(r"(%%|%s)", sql):
        if part == "%s":
            if position in taken:
                kept[position] = len(kept)
            else:
                part = Literal(params[position]).as_string(connection.connection).replace("%", "%%")
            position += 1
        parts.append(part)
    left = [params[position] for position in sorted(kept)]
    return "".join(parts), left, [(name, tuple(kept[p] for p in positions)) for name, positions in slots]
