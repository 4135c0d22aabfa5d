"""Straight from the database, beside the services: API tokens for the clients (issued by the service,
as `manage.py create_token` does; DRF's, as an earlier install made them), what a backup of the test
database holds (`pg_dump`, the SQLite files), and what PostgreSQL reports about connections,
sessions and the events table (pg_stat_activity, pg_stat_database, pg_stat_user_tables)."""

import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from django.apps.registry import Apps
from django.contrib.auth.models import User
from django.db import connection, models
from django.db.migrations.executor import MigrationExecutor

from runs.notify.listener import APPLICATION_NAME_PREFIX
from runs.services.tokens import token_create
from tests.support.procs import Proc
from tests.support.waiting import wait_until


def token_for(user: User, *, name: str | None = None, expires_at: datetime | None = None) -> str:
    """The key of a new API token of `user` (a new one each call: no key can be read back)."""
    return token_create(user=user, name=name or f"test-{secrets.token_hex(4)}", expires_at=expires_at)[1]


def _pg_bindir() -> Path:
    # The cluster's own binaries when the suite made it (bin/pgcluster notes them), else the machine's.
    root = os.environ.get("RUNLEDGER_TEST_PGDIR")
    if root and (Path(root) / "bindir").is_file():
        return Path((Path(root) / "bindir").read_text().strip())
    pg_config = shutil.which("pg_config")
    assert pg_config is not None, "pg_dump needs PostgreSQL's binaries (pg_config on PATH)"
    return Path(subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True).stdout.strip())


def database_dump() -> bytes:
    """Every byte a backup of the test database holds: `pg_dump`'s output on PostgreSQL; on SQLite
    the database file with its -wal and -journal files, free pages and old frames included."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        files = [Path(db["NAME"] + suffix) for suffix in ("", "-wal", "-journal")]
        return b"".join(path.read_bytes() for path in files if path.exists())
    env = {**os.environ, "PGPASSWORD": db.get("PASSWORD") or ""}
    command = [str(_pg_bindir() / "pg_dump"), "-h", db["HOST"], "-p", str(db["PORT"]), "-U", db["USER"], db["NAME"]]
    return subprocess.run(command, env=env, capture_output=True, check=True, timeout=120).stdout


@contextmanager
def migrated_across(before: str, after: str) -> Iterator[Apps]:
    """The models of runs' migration `before`, the database migrated back to it; on leaving,
    migrated through `after` alone, then on to the last migration (today's models again)."""
    executor = MigrationExecutor(connection)
    executor.migrate([("runs", before)])
    try:
        yield executor.loader.project_state([("runs", before)]).apps
    finally:
        MigrationExecutor(connection).migrate([("runs", after)])
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


def drf_token_model() -> type[models.Model]:
    """Django REST framework's token table (`authtoken_token`) as an earlier install left it, for a
    test to make and fill: a model of a registry of its own, so that no app knows it."""
    meta = type("Meta", (), {"app_label": "authtoken", "db_table": "authtoken_token", "apps": Apps()})
    fields = {
        "key": models.CharField(max_length=40, primary_key=True),
        "user_id": models.IntegerField(unique=True),
        "created": models.DateTimeField(),
    }
    return type("Token", (models.Model,), {"__module__": __name__, "Meta": meta, **fields})


def query_one(sql: str, params: list[Any]) -> Any:
    """The first column of the first row of `sql`, on this thread's connection."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


def settled(read: Callable[[], int], what: str) -> int:
    """A cumulative statistic once PostgreSQL stops moving it: backends flush their counts to the
    statistics when they go idle or close, a moment after what they count happened."""
    seen = [read()]

    def still() -> bool:
        time.sleep(0.3)  # the interval between two looks at the statistics
        seen.append(read())
        return seen[-1] == seen[-2]

    wait_until(still, 15, f"{what} settle")
    return seen[-1]


# --- connections ----------------------------------------------------------------------------------


def sessions_started() -> int:
    """Sessions (client connections) the server has started on the test database so far."""
    return int(query_one("SELECT sessions FROM pg_stat_database WHERE datname = current_database()", []))


def sessions_settled() -> int:
    return settled(sessions_started, "session statistics")


def connections_named(application_name: str) -> int:
    """Connections to the server that carry `application_name` (see procs.web_env)."""
    return int(query_one("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [application_name]))


def waiting_on_a_lock() -> int:
    """Sessions of this database that wait for a lock another holds (a row lock, mostly)."""
    return int(
        query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'", []
        )
    )


def listen_connections(role: str) -> list[tuple[str, int]]:
    """(application name, backend pid) of every LISTEN connection that processes of `role` ("web",
    "worker") hold on the server. runs.notify.listener names each
    `runledger-listen:<role>:<process id>`."""
    with connection.cursor() as cursor:
        cursor.execute(
            # This database's: another test process (bin/test runs several) has its own.
            "SELECT application_name, pid FROM pg_stat_activity WHERE application_name LIKE %s"
            " AND datname = current_database()",
            [f"{APPLICATION_NAME_PREFIX}:{role}:%"],
        )
        return list(cursor.fetchall())


def _pid_in(application_name: str) -> int:
    return int(application_name.rsplit(":", 1)[1])


def listening(role: str) -> set[int]:
    """Pids of the processes of `role` whose LISTEN connection is on the server."""
    return {_pid_in(name) for name, _ in listen_connections(role)}


def listening_pids() -> list[int]:
    """Process ids of the workers whose LISTEN connection the server has."""
    return [_pid_in(name) for name, _ in listen_connections("worker")]


def listen_pids() -> dict[str, int]:
    """The web processes' LISTEN connections: application name → backend pid (a new backend pid
    under the same name is a reconnect)."""
    return dict(listen_connections("web"))


def listener_backends(proc: Proc, role: str = "worker") -> list[int]:
    """The PostgreSQL backends of the LISTEN connection of one process."""
    return [backend for name, backend in listen_connections(role) if _pid_in(name) == proc.pid]


# --- the events table -----------------------------------------------------------------------------


def event_table_scans() -> int:
    """Scans (sequential and index) of the events table that PostgreSQL's statistics count so far."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables "
            "WHERE relname = 'runs_runevent'"
        )
        return int(cursor.fetchone()[0])


def event_table_reads() -> int:
    """Scans of the events table, once PostgreSQL's statistics stop moving (backends flush them
    when they close, which the web process's reads do right away)."""
    return settled(event_table_scans, "event-table statistics")
