"""Importing the app changes nothing of its process: every module of runs/, imported in a fresh
interpreter once Django is set up, leaves the environment, the settings, prometheus-client's value
class and Django's signal receivers as they were. What a process must set up is done at its start
(runworker, the ASGI wrapper) or first use (docs/design/operations.md#metrics-store)."""

import asyncio
import json
from pathlib import Path

import pytest
from django.db import connection

from runs.conf import conf
from runs.worker.db import Db
from tests.support.local_files import run_python

IMPORT_EVERYTHING = """
import importlib, json, os, pkgutil, warnings, weakref
from django.conf import settings
from django.core import signals as core_signals
from django.db import connections
from django.db.backends import signals as db_signals
from django.db.models import signals as model_signals
from prometheus_client import values

connections.settings  # Django fills in each database's defaults, in place, once: not the app's doing


def settings_now():
    return {name: repr(getattr(settings, name)) for name in dir(settings) if name.isupper()}


def receivers_now():
    # The app's own receivers of Django's signals (libraries connect theirs at import).
    found = []
    for module in (core_signals, db_signals, model_signals):
        for name, signal in vars(module).items():
            for entry in getattr(signal, "receivers", ()):
                receiver = entry[1]() if isinstance(entry[1], weakref.ReferenceType) else entry[1]
                if getattr(receiver, "__module__", "").startswith("runs"):
                    found.append(f"{name}: {receiver.__module__}.{receiver.__qualname__}")
    return sorted(found)


# Loaded (Django set TZ from TIME_ZONE), not yet set up: the app's modules are imported from here on.
settings_before, environ_before, value_class = settings_now(), dict(os.environ), values.ValueClass
import django

django.setup()
receivers_before = receivers_now()  # what the app's ready() connects, as it should
import runs

warnings.simplefilter("ignore", DeprecationWarning)  # an old import path still imports, and says so
imported = [importlib.import_module(found.name).__name__ for found in pkgutil.walk_packages(runs.__path__, "runs.")]
settings_after, receivers_after = settings_now(), receivers_now()
print(json.dumps({
    "imported": imported,
    "environment": sorted(k for k in set(environ_before) | set(os.environ) if environ_before.get(k) != os.environ.get(k)),
    "settings": sorted(k for k in set(settings_before) | set(settings_after) if settings_before.get(k) != settings_after.get(k)),
    "value_class_kept": values.ValueClass is value_class,
    "receivers": sorted(set(receivers_after) - set(receivers_before)),
}))
"""


@pytest.mark.sqlite
@pytest.mark.timeout(120)
def test_importing_every_module_of_the_app_changes_no_environment_variable_setting_or_global(tmp_path: Path) -> None:
    done = run_python(
        IMPORT_EVERYTHING,
        setup=False,
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        DJANGO_SECRET_KEY="k" * 50,
        TMPDIR=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    # Every module, the process machinery among them, was imported.
    assert {"runs.metrics.store", "runs.metrics.series", "runs.worker.db", "runs.asgi"} <= set(found["imported"])
    assert found["environment"] == []
    assert found["settings"] == []
    assert found["value_class_kept"] is True
    assert found["receivers"] == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(30)
def test_a_workers_lanes_end_their_own_sessions_idle_in_a_transaction_past_a_lease_once_made() -> None:
    """A worker's lanes, once made (at its start), give their connections, and only theirs, the
    server-side bound on a transaction left idle."""

    def timeout_ms() -> str:
        with connection.cursor() as cursor:
            # In milliseconds, whatever unit it was set in.
            cursor.execute("SELECT setting FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout'")
            row = cursor.fetchone()
            assert row is not None
            return str(row[0])

    db = Db(work_threads=1)
    try:
        on_lanes = asyncio.run(db.control.call(timeout_ms))
    finally:
        db.stop()
    assert on_lanes == str(int(conf.LEASE_SECONDS * 1000))
    assert timeout_ms() == "0"  # this thread's connection is no lane's
