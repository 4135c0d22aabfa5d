"""Several web processes under one uvicorn (`uvicorn --workers N`): uvicorn's supervisor binds the
port and hands connections to child processes, each a web process of its own with its own pool,
stream hub and LISTEN connection (PostgreSQL only: the listeners are the evidence). Stopping the
supervisor stops them all."""

import asyncio
import signal

import pytest
from django.contrib.auth.models import User

from tests.factories import running_run
from tests.support.db import listening, token_for
from tests.support.procs import (
    UNCAPPED,
    Procs,
    group_members,
    parent_of,
    process_gone,
    start_writer,
    subprocess_env,
    uvicorn_refusal,
)
from tests.support.runs import assert_exact_log
from tests.support.seed import SEED
from tests.support.sse import Event, auth_headers, stream_path, watch
from tests.support.threads import DbThread
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def test_several_web_processes_under_one_uvicorn_serve_every_watcher_every_event(procs: Procs, alice: User) -> None:
    print(f"seed {SEED}")
    # Until both children serve, the kernel may give one of them more than the cap of alice's.
    master = procs.uvicorn(workers=2, env=subprocess_env(**UNCAPPED))
    token = token_for(alice)
    run = running_run(alice)
    children: set[int] = set()

    async def scenario(db: DbThread) -> list[list[Event]]:
        watchers: list[asyncio.Task[list[Event]]] = []
        # The kernel gives each new connection to whichever child accepts it first, so a burst
        # might all land on one: open them one by one until there are 20 and both children serve
        # streams (each opens its LISTEN connection with its first stream).
        while len(watchers) < 20 or len(children) < 2:
            if len(watchers) >= 200:
                pytest.fail(f"after 200 streams, only the web processes {children} serve any")
            connected = asyncio.Event()
            path = stream_path(run)
            watchers.append(asyncio.create_task(watch(master.url, path, auth_headers(token), connected=connected)))
            await asyncio.wait_for(connected.wait(), 10)
            # Listeners of this test's processes only (a previous test's may linger a moment).
            children.update(await db.run(lambda: listening("web")) & set(group_members(master.pid)))
        print(f"{len(watchers)} watchers over the web processes {sorted(children)}")
        writer = start_writer(procs, run, count=50, seed=SEED, pause_ms=10)
        results = await asyncio.wait_for(asyncio.gather(*watchers), 60)
        await asyncio.to_thread(writer.wait_exit)
        return results

    with DbThread() as db:
        results = asyncio.run(scenario(db))

    # Two web processes, both the supervisor's children, not the supervisor itself.
    assert len(children) == 2 and master.pid not in children
    assert {parent_of(pid) for pid in children} == {master.pid}
    run.refresh_from_db()
    assert run.status == "completed"
    for events in results:
        assert_exact_log(events, run)

    # SIGTERM to the supervisor alone: it stops its children, and nothing of its process group
    # (its multiprocessing helper included, which leaves a moment after it) outlives it.
    master.signal(signal.SIGTERM)
    assert master.popen.wait(timeout=15) == 0, master.log()
    wait_until(lambda: group_members(master.pid) == [], 10, "the supervisor's whole process group gone")
    assert all(process_gone(pid) for pid in children)


def test_a_web_process_without_request_threads_refuses_to_start() -> None:
    refused = uvicorn_refusal(subprocess_env(RUNLEDGER_WEB_THREADS="0"))
    assert "RUNLEDGER_WEB_THREADS must be a whole number ≥ 1, not '0'" in refused.stderr
