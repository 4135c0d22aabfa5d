"""The suite's own throwaway PostgreSQL cluster, which a test marked `pg_cluster` may stop and start."""

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection


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
        # Whatever Django held belongs to the old server. The test's own pool is started afresh
        # too: finding its dead connections one by one costs its first query after the restart
        # up to the pool's timeout, which the test's own bookkeeping need not wait out (the
        # processes under test recover by themselves, and their tests prove it).
        connection.close()
        connection.close_pool()


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
