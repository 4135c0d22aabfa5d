"""The app's own body limit without nginx in front (docs/design/operations.md#deploy): a body over the
limit, declared or chunked, is refused before Django reads or spools it; one under it is served."""

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User

from runs import services
from runs.models import RunAttempt
from tests.support.db import token_for
from tests.support.procs import Proc, Procs, subprocess_env
from tests.support.raw_http import request, upload
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

MB = 1024 * 1024


@dataclass
class BareWeb:
    web: Proc
    tmpdir: Path  # its TMPDIR, where Django would spool request bodies


@pytest.fixture(scope="module")
def bare(django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BareWeb]:
    """uvicorn alone, as in a deployment without a proxy, with an empty temporary folder of its own."""
    registry = Procs(Path(tmp_path_factory.mktemp("bare")))
    tmpdir = Path(tmp_path_factory.mktemp("bare-tmpdir"))
    try:
        with django_db_blocker.unblock():
            # Its metrics files (by default under TMPDIR) elsewhere: that folder is for spooled bodies only.
            metrics = tmp_path_factory.mktemp("bare-metrics")
            env = subprocess_env(TMPDIR=str(tmpdir), RUNLEDGER_METRICS_DIR=str(metrics))
        yield BareWeb(web=registry.uvicorn(env=env), tmpdir=tmpdir)
    finally:
        registry.stop_all()


def open_files_under(pid: int, folder: Path) -> list[str]:
    """Files the process holds open in `folder` (an unnamed O_TMPFILE shows as `folder/#inode`)."""
    found = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith(str(folder)):
                found.append(target)
    return found


def assert_nothing_spooled(bare: BareWeb) -> None:
    assert list(bare.tmpdir.iterdir()) == []
    assert open_files_under(bare.web.pid, bare.tmpdir) == []


def assert_payload_too_large(answer: Any) -> None:
    assert answer.status == 413
    assert answer.headers["connection"] == "close"
    assert answer.headers["content-type"] == "application/json"
    error = json.loads(answer.body)["error"]
    assert error["code"] == "payload_too_large"
    assert error["detail"] == {"limit_bytes": settings.DATA_UPLOAD_MAX_MEMORY_SIZE}
    assert answer.closed  # the connection goes with the answer


@pytest.mark.sqlite
def test_without_nginx_a_declared_body_over_the_limit_is_refused_at_once_unread(bare: BareWeb) -> None:
    assert bare.web.port is not None
    # An anonymous client declares 1.5 GB and sends only its headers.
    answer = upload(("127.0.0.1", bare.web.port), "/api/runs/", size=1_500_000_000, body_bytes=0)
    print(f"413 in {answer.seconds * 1000:.2f} ms")
    assert_payload_too_large(answer)
    assert answer.seconds < 2
    assert_nothing_spooled(bare)


@pytest.mark.sqlite
def test_without_nginx_a_body_a_little_over_the_limit_sent_whole_gets_its_answer_and_no_reset(bare: BareWeb) -> None:
    assert bare.web.port is not None
    # As an HTTP client sends a body (the Python client's httpx too): all of it, then it reads.
    body = b"x" * (3 * settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    answer = request(("127.0.0.1", bare.web.port), "/api/runs/", method="POST", body=body)
    assert_payload_too_large(answer)
    # The server read the body and dropped it before it answered: the connection ended with a FIN,
    # not the reset that a close with the body unread sends, which can lose the answer.
    assert not answer.reset
    assert_nothing_spooled(bare)


@pytest.mark.sqlite
def test_without_nginx_a_chunked_body_is_refused_once_it_passes_the_limit(bare: BareWeb) -> None:
    assert bare.web.port is not None
    # 16 MB/s: the bound below then leaves the server 150 ms to answer, on a busy machine too.
    answer = upload(("127.0.0.1", bare.web.port), "/api/runs/", size=64 * MB, chunked=True, chunk_size=16 * 1024)
    print(f"413 after {answer.sent / 1024:.0f} KiB of the chunked body")
    assert_payload_too_large(answer)
    # Answered before the client had sent as much as Django keeps in memory before it spools to
    # disk (FILE_UPLOAD_MAX_MEMORY_SIZE): whatever the server read, none of it reached a file.
    assert settings.DATA_UPLOAD_MAX_MEMORY_SIZE < answer.sent < settings.FILE_UPLOAD_MAX_MEMORY_SIZE
    assert_nothing_spooled(bare)


@pytest.mark.sqlite
def test_without_nginx_a_body_under_the_limit_is_served(bare: BareWeb, alice: User) -> None:
    assert bare.web.port is not None
    headers = {"Authorization": f"Token {token_for(alice)}", "Content-Type": "application/json"}
    body = json.dumps({"agent": "demo", "input": {"deltas": 1, "pad": "x" * 200_000}}).encode()
    assert len(body) < settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    answer = request(("127.0.0.1", bare.web.port), "/api/runs/", method="POST", headers=headers, body=body)
    assert answer.status == 201, answer.body[:300]
    created = json.loads(answer.body)
    assert len(created["input"]["pad"]) == 200_000
    assert_nothing_spooled(bare)
    # The module's worker (`front`, when it is up) takes this run too: end it, and let the worker
    # let go of it, so that no transaction of the worker's meets the database's flush after the test.
    services.run_cancel(run_id=created["id"], actor=alice)
    wait_until(
        lambda: not RunAttempt.objects.filter(run_id=created["id"], released_at__isnull=True).exists(),
        what="the run's attempt released",
    )
