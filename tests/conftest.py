import os
import re
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection

pytest_plugins = ["tests.support.procs", "tests.support.browser"]

ON_SQLITE = os.environ.get("DATABASE_URL", "").startswith("sqlite")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # On SQLite only the tests that claim to hold there may run; bin/test selects them with
    # -m sqlite, and this guards a hand-run that forgot to.
    if ON_SQLITE:
        kept = [item for item in items if item.get_closest_marker("sqlite") is not None]
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept


@pytest.fixture(autouse=True, scope="session")
def _fast_password_hasher() -> None:
    from django.conf import settings

    # The default hasher costs half a second a user; tests need many users, not strong hashes.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def make_user(db: None) -> Callable[..., User]:
    counter = iter(range(1_000_000))

    def make(username: str | None = None, *, perms: tuple[str, ...] = (), is_staff: bool = False) -> User:
        user = User.objects.create_user(
            username=username or f"user{next(counter)}", password="pw-for-tests", is_staff=is_staff
        )
        for perm in perms:
            app_label, codename = perm.split(".")
            user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
        return User.objects.get(pk=user.pk)  # fresh, so the permission cache is empty

    return make


@pytest.fixture
def alice(make_user: Callable[..., User]) -> User:
    return make_user("alice")


@pytest.fixture
def bob(make_user: Callable[..., User]) -> User:
    return make_user("bob")


def race(n: int, target: Callable[[int], Any]) -> list[Any]:
    """Run `target(i)` in n real threads, each on its own database connection, released together.

    Returns each thread's result, or the exception it raised.
    """
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def body(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = target(i)
        except BaseException as exc:  # the caller inspects what each thread met
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
        assert not t.is_alive(), "a racing thread hung"
    return results


class PgCluster:
    """The suite's own throwaway PostgreSQL cluster (bin/pgcluster), which a test may stop and start.

    The server runs as the `postgres` system user when the tests run as root, as bin/pgcluster
    starts it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.bindir = Path((root / "bindir").read_text().strip())
        self.running = True

    def port(self) -> str:
        ports = re.findall(r"^port = (\d+)", (self.data / "postgresql.conf").read_text(), re.MULTILINE)
        return ports[-1] if ports else ""

    def _pg_ctl(self, *args: str) -> None:
        cmd = [str(self.bindir / "pg_ctl"), "-D", str(self.data), *args]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=90)

    def stop(self) -> None:
        """A fast shutdown (clean: the cluster runs with fsync off, so never an immediate one)."""
        connection.close()  # the test's own connection would only see the server go
        self.running = False
        self._pg_ctl("-m", "fast", "-w", "-t", "60", "stop")

    def start(self) -> None:
        self._pg_ctl("-l", str(self.root / "server.log"), "-w", "-t", "60", "start")
        self.running = True
        connection.close()  # whatever Django held belongs to the old server


@pytest.fixture
def pg_cluster(request: pytest.FixtureRequest) -> Iterator[PgCluster]:
    """The suite's cluster, started again after the test whatever happened (tests marked `pg_cluster`)."""
    if request.node.get_closest_marker("pg_cluster") is None:
        pytest.fail("a test using the pg_cluster fixture must be marked @pytest.mark.pg_cluster")
    root = os.environ.get("RUNLEDGER_TEST_PGDIR")
    if not root:
        pytest.fail(
            "this test restarts PostgreSQL, so it needs the suite's own cluster: RUNLEDGER_TEST_PGDIR must name "
            "the bin/pgcluster directory of the cluster at DATABASE_URL (bin/test sets it). Against an outside "
            "database, leave these tests out with -m 'not pg_cluster'."
        )
    if connection.vendor != "postgresql":
        pytest.fail("the pg_cluster fixture needs PostgreSQL")
    cluster = PgCluster(Path(root))
    if cluster.port() != str(connection.settings_dict["PORT"]):
        pytest.fail(
            f"RUNLEDGER_TEST_PGDIR={root} runs on port {cluster.port()}, but the tests use port "
            f"{connection.settings_dict['PORT']}: refusing to restart a cluster the tests are not using"
        )
    try:
        yield cluster
    finally:
        if not cluster.running:
            cluster.start()
