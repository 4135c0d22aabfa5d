"""bin/edge and the edge's settings (docs/design/edge.md): Pushpin in the foreground until SIGTERM,
the signing key derived from the secret key, and the starts refused (SQLite, an HTTP control port)."""

import asyncio
import hashlib
import hmac
import signal
from typing import Any

import pytest
from django.contrib.auth.models import User

from tests.factories import running_run
from tests.support.db import token_for
from tests.support.edge import control_socket, edge_env, settings_of, start_edge, until_seq
from tests.support.procs import Procs, process_gone, subprocess_env, uvicorn_refusal
from tests.support.sse import Event, Stream, auth_headers, stream_path
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@pytest.mark.edge
@pytest.mark.processes
def test_bin_edge_runs_pushpin_in_the_foreground_until_sigterm(procs: Procs, alice: User) -> None:
    control = control_socket()
    web = procs.uvicorn(env=edge_env(control))
    edge = start_edge(procs, upstream=web, control=control)
    run = running_run(alice)
    token = token_for(alice)

    async def held() -> Stream:
        stream = await Stream(edge.url, stream_path(run), auth_headers(token)).open()
        assert stream.status == 200
        return stream

    async def scenario() -> list[Event]:
        stream = await held()
        events = [event async for event in until_seq(stream, 2)]
        # SIGTERM to bin/edge's PID: it passes it on to Pushpin, which stops every part of it.
        parts = list(edge.proc.companions)
        edge.proc.signal(signal.SIGTERM)
        assert await asyncio.to_thread(edge.proc.popen.wait, 15) == 0, edge.log()
        await asyncio.to_thread(wait_until, lambda: all(process_gone(pid) for pid in parts), 10, "Pushpin's parts gone")
        rest = [event async for event in stream.events()]  # the held stream ends with it
        return events + rest

    events = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert [e.seq for e in events] == [1, 2]
    assert "stopped" in edge.log()


def test_the_signing_key_is_derived_from_the_secret_key_unless_set() -> None:
    derived = settings_of(DJANGO_SECRET_KEY="s" * 50)
    assert derived.stdout.strip() == hmac.new(b"s" * 50, b"runledger.grip-key", hashlib.sha256).hexdigest()
    assert settings_of(DJANGO_SECRET_KEY="t" * 50).stdout.strip() != derived.stdout.strip()
    chosen = "K" * 40
    assert settings_of(RUNLEDGER_GRIP_KEY=chosen).stdout.strip() == chosen
    # A key Pushpin's configuration would read otherwise (a file, base64, a list), or too short.
    for bad in ("file:/etc/key" + "x" * 30, "a,b" + "x" * 40, "short"):
        refused = settings_of(RUNLEDGER_GRIP_KEY=bad)
        assert refused.returncode != 0
        assert "RUNLEDGER_GRIP_KEY must be" in refused.stderr


def test_a_web_process_with_an_edge_on_sqlite_refuses_to_start(tmp_path: Any) -> None:
    env = subprocess_env(
        RUNLEDGER_GRIP_URL=f"ipc://{tmp_path}/control", DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite3"
    )
    refused = uvicorn_refusal(env)
    assert "RUNLEDGER_GRIP_URL needs PostgreSQL" in refused.stderr
