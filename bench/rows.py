"""Rows written in bulk for the benchmarks that need a full database (the growth tiers, the caps'
cost): one `INSERT … SELECT` naming every column of the model, so that a column added later takes
its default here rather than breaking the benchmark. Import only after `django.setup()`.
"""

from collections.abc import Mapping
from typing import Any

from django.db import connection, models
from django.db.models.fields import NOT_PROVIDED


def insert_select(model: type[models.Model], values: Mapping[str, str], source: str) -> tuple[str, dict[str, Any]]:
    """The statement `INSERT INTO <table> (<every column>) SELECT … <source>` and its parameters.

    Each column's expression is `values[column]` (SQL over `source`'s columns, with `%(name)s`
    parameters of the caller's own), else the field's default as a parameter, else NULL; a column
    the database numbers itself is left to it. A column with none of these, a primary key not given
    (one default would repeat in every row) or a name in `values` that is no column raises.
    """
    fields = {f.column: f for f in model._meta.concrete_fields}
    if unknown := set(values) - set(fields):
        raise ValueError(f"{model.__name__} has no column {', '.join(sorted(unknown))}")
    columns, exprs, params = [], [], {}
    for column, field in fields.items():
        if column in values:
            expr = values[column]
        elif isinstance(field, models.AutoField | models.BigAutoField) or field.db_default is not NOT_PROVIDED:
            continue
        elif field.primary_key:
            raise ValueError(f"{model.__name__}.{column}: the primary key needs an expression")
        elif field.has_default():
            params[f"default_{column}"] = field.get_db_prep_save(field.get_default(), connection)
            expr = f"%(default_{column})s"
        elif field.null:
            expr = "NULL"
        else:
            raise ValueError(f"{model.__name__}.{column}: not null and no default, so it needs an expression")
        columns.append(column)
        exprs.append(expr)
    table = model._meta.db_table
    sql = f"INSERT INTO {table} ({', '.join(columns)})\nSELECT {', '.join(exprs)}\n{source}"
    return sql, params


def cancelled_runs(**columns: str) -> dict[str, str]:
    """The column expressions of a demo run cancelled by its owner, created `n` seconds ago (`n`: a
    column of the source, e.g. `generate_series(1, N) AS n`), with a small input as the API stores
    it; `columns` add to them or replace them (`owner_id` has none: give it)."""
    return {
        "id": "gen_random_uuid()",
        "agent": "'demo'",
        "input": """'{"deltas": 40}'""",
        "status": "'cancelled'",
        "end_code": "'cancelled_by_user'",
        "ended_by": "'bench'",
        "last_seq": "2",
        "events_used": "1",
        "created_at": "now() - make_interval(secs => n)",
        "queued_at": "now() - make_interval(secs => n)",
        "ended_at": "now()",
        "updated_at": "now()",
        "input_bytes": "13",
        "stored_bytes": "120",
        "ended_bytes": "120",
        **columns,
    }
