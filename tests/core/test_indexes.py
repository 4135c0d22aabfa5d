"""No column is indexed twice (docs/design/deployment.md#indexes): every index is written on each
insert and on each update that moves a row's entries, so an index whose columns begin another's
only costs writes. PostgreSQL's catalog is read: SQLite's indexes follow the same models."""

import pytest
from django.apps import apps
from django.db import connection

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(30)]

# Each plain (not unique, not partial, not of an expression) B-tree index of a table, with its
# columns in order; and every whole-table B-tree index of the table whose columns it might begin.
INDEXES = """
SELECT c.relname, i.relname, idx.indisunique, idx.indpred IS NOT NULL, idx.indexprs IS NOT NULL,
       ARRAY(SELECT a.attname FROM unnest(idx.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)
             JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum ORDER BY k.n)
FROM pg_index idx
JOIN pg_class c ON c.oid = idx.indrelid
JOIN pg_class i ON i.oid = idx.indexrelid
JOIN pg_am am ON am.oid = i.relam
WHERE am.amname = 'btree' AND c.relname = ANY(%s)
"""


def test_no_plain_index_of_the_apps_tables_begins_another() -> None:
    tables = [model._meta.db_table for model in apps.get_app_config("runs").get_models()]
    with connection.cursor() as cursor:
        cursor.execute(INDEXES, [tables])
        rows = cursor.fetchall()
    assert {row[0] for row in rows} >= {"runs_run", "runs_runevent", "runs_runattempt"}
    twice = [
        f"{table}: {name} {columns} begins {other} {longer}"
        for table, name, unique, partial, expression, columns in rows
        if not (unique or partial or expression)
        for table2, other, _, partial2, expression2, longer in rows
        if table2 == table and other != name and not (partial2 or expression2) and longer[: len(columns)] == columns
    ]
    assert twice == [], "indexed twice (give the foreign key db_index=False):\n" + "\n".join(twice)
