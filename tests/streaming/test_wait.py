"""The server-side wait (docs/design/streaming.md#wait): `GET /api/runs/{id}/wait/?timeout=S` answers
the run's JSON plus `wait_result` once the run ended or waits, or at the timeout with the run as it
is; it counts against the user's cap of streams, and while it waits it holds no thread and no
database connection (200 waiters of one run, counted for real). Its delay after the terminal commit
is a figure of bench/wait.py, not asserted here.

One uvicorn for the module (a cap of 1 stream per user, so that a second wait proves one is held);
the 200 waiters have one of their own.
"""

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from runs import services
from runs.events import WaitReason
from runs.models import Run
from tests.factories import queued_run, running_run, waiting_run
from tests.support.db import query_one, token_for
from tests.support.procs import Proc, Procs, threads_of, web_env
from tests.support.sse import Stream, auth_headers, request_once
from tests.support.threads import in_thread
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.sqlite, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

ON_POSTGRESQL = not os.environ.get("DATABASE_URL", "").startswith("sqlite")


@pytest.fixture(scope="module")
def web(django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    registry = Procs(Path(tmp_path_factory.mktemp("wait-web")))
    try:
        with django_db_blocker.unblock():
            env = web_env("wait-web", RUNLEDGER_MAX_STREAMS_PER_USER="1")
        yield registry.uvicorn(env=env)
    finally:
        registry.stop_all()


def wait_path(run: Run | str, query: str = "timeout=20") -> str:
    return f"/api/runs/{run.pk if isinstance(run, Run) else run}/wait/?{query}"


def get(web: Proc, path: str, token: str | None, method: str = "GET") -> Stream:
    return request_once(web.url, path, auth_headers(token) if token else {}, method)


async def wait_for(web: Proc, path: str, token: str) -> Stream:
    return await Stream(web.url, path, auth_headers(token)).open(timeout=60)


def in_other_thread(fn: Any) -> Any:
    return asyncio.to_thread(in_thread(fn))


def test_an_ended_or_waiting_run_is_answered_at_once_with_the_runs_own_json(web: Proc, alice: User) -> None:
    token = token_for(alice)
    run = running_run(alice)
    services.run_complete(run_id=run.pk, generation=run.generation, output={"n": 1})
    answer = get(web, wait_path(run), token)
    assert answer.status == 200 and answer.headers["content-type"] == "application/json"
    body = answer.json()
    assert body.pop("wait_result") == "ended"
    assert body == Client().get(f"/api/runs/{run.pk}/", HTTP_AUTHORIZATION=f"Token {token}").json()
    # Waiting for input: `waiting`, with the resume ticket its owner sees.
    parked = waiting_run(alice)
    body = get(web, wait_path(parked), token).json()
    assert body["wait_result"] == "waiting" and body["status"] == "waiting"
    assert body["resume_ticket"] == parked.resume_ticket


async def held(web: Proc, run: Run, token: str, n: int = 1) -> list["asyncio.Task[Stream]"]:
    """`n` waits of `run` (timeout 55 s), once the server holds them: with a cap of `n` streams per
    user, a probe of the same user is then a 429. A wait that a probe beat to the last slot is
    itself a 429: it is sent again."""

    def send() -> "asyncio.Task[Stream]":
        return asyncio.create_task(wait_for(web, wait_path(run, "timeout=55"), token))

    waits = [send() for _ in range(n)]
    for _ in range(200):
        probe = await asyncio.to_thread(get, web, wait_path(run, "timeout=0.05"), token)
        refused = [i for i, waiting in enumerate(waits) if waiting.done()]
        if probe.status == 429 and not refused:
            return waits
        for i in refused:
            assert waits[i].result().status == 429, waits[i].result().body
            waits[i] = send()
    raise AssertionError("the waits were never all held")


def test_a_wait_answers_when_the_run_ends_and_holds_a_slot_of_the_users_cap_meanwhile(web: Proc, alice: User) -> None:
    token = token_for(alice)
    run = running_run(alice)

    async def scenario() -> Stream:
        [waiting] = await held(web, run, token)  # and so a second wait of the user is a 429
        await in_other_thread(lambda: services.run_complete(run_id=run.pk, generation=run.generation, output="ok"))
        return await waiting

    answer = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert answer.status == 200
    assert (answer.json()["wait_result"], answer.json()["status"]) == ("ended", "completed")
    # The slot was given back: another running run's wait is held (it times out).
    assert get(web, wait_path(running_run(alice), "timeout=0.1"), token).json()["wait_result"] == "timeout"


def test_a_run_that_starts_waiting_is_answered_waiting_and_a_timeout_answers_the_run_as_it_is(
    web: Proc, alice: User
) -> None:
    token = token_for(alice)
    run = running_run(alice)
    started = time.monotonic()
    timed_out = get(web, wait_path(run, "timeout=0.3"), token)
    assert time.monotonic() - started >= 0.3
    body = timed_out.json()
    assert (body["wait_result"], body["status"], body["last_seq"]) == ("timeout", "running", run.last_seq)

    answer = held_until_it_waits(web, run, token)
    assert (answer.json()["wait_result"], answer.json()["status"]) == ("waiting", "waiting")


def held_until_it_waits(web: Proc, run: Run, token: str) -> Stream:
    """The answer of a wait of the running `run`, held by the server, once the run asks for input."""

    async def scenario() -> Stream:
        [waiting] = await held(web, run, token)
        await in_other_thread(
            lambda: services.run_wait(run_id=run.pk, generation=run.generation, reason=WaitReason.INPUT_REQUIRED)
        )
        return await waiting

    return asyncio.run(asyncio.wait_for(scenario(), 60))


def test_every_wait_answer_is_no_store_as_it_may_carry_the_resume_ticket(web: Proc, alice: User) -> None:
    token = token_for(alice)
    parked = waiting_run(alice)
    at_once = get(web, wait_path(parked), token)
    assert at_once.json()["resume_ticket"] == parked.resume_ticket
    assert at_once.headers["cache-control"] == "no-store"
    # A wait that must wait sends its head before it knows: no-store too.
    run = running_run(alice)
    answer = held_until_it_waits(web, run, token)
    run.refresh_from_db()
    assert answer.json()["resume_ticket"] == run.resume_ticket != ""
    assert answer.headers["cache-control"] == "no-store"
    timed_out = get(web, wait_path(running_run(alice), "timeout=0.1"), token)
    assert timed_out.json()["wait_result"] == "timeout" and timed_out.headers["cache-control"] == "no-store"


def test_a_waits_head_comes_at_admission_and_a_client_that_leaves_gives_its_slot_back(web: Proc, alice: User) -> None:
    token = token_for(alice)
    run = running_run(alice)
    url = urlsplit(web.url)

    async def head_then_leave() -> str:
        reader, writer = await asyncio.open_connection(url.hostname, url.port)
        request = (
            f"GET {wait_path(run, 'timeout=50')} HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Token {token}\r\n\r\n"
        )
        writer.write(request.encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
        writer.close()  # gone while it waits
        return head.decode("latin-1").split("\r\n")[0]

    # With a cap of one, each wait after the first is admitted only if the one before gave its slot back.
    for _ in range(3):
        status_line = wait_until(lambda: (line := asyncio.run(head_then_leave())).split(" ")[1] != "429" and line, 20)
        assert status_line.split(" ")[1] == "200"
    services.run_complete(run_id=run.pk, generation=run.generation, output="ok")
    assert get(web, wait_path(run), token).json()["wait_result"] == "ended"


def test_a_wait_is_checked_as_a_read_of_the_run(web: Proc, alice: User, bob: User) -> None:
    token = token_for(alice)
    run = running_run(alice)
    assert get(web, wait_path(run), None).status == 401
    assert get(web, wait_path(run), token_for(bob)).status == 404
    assert get(web, wait_path(run), token, method="POST").status == 405
    for bad in ("0", "-1", "60.5", "abc", "nan", "inf", ""):
        refused = get(web, wait_path(run, f"timeout={bad}"), token)
        assert refused.status == 400, bad
        assert list(refused.json()["error"]["detail"]) == ["timeout"]


def test_200_waiters_of_one_run_hold_no_thread_nor_connection_and_all_answer_ended(procs: Procs, alice: User) -> None:
    n = 200
    # A cap of n: the n + 1st wait is a 429 exactly when all n are held, waiting.
    web = procs.uvicorn(env=web_env("wait-many-web", RUNLEDGER_MAX_STREAMS_PER_USER=str(n)))
    token = token_for(alice)
    run = running_run(alice)
    measured: dict[str, int] = {}
    # Both of the hub's small pools used once (a check, a read), so that their threads exist before.
    done = queued_run(alice)
    services.run_cancel(run_id=done.pk, actor=alice)
    for _ in range(8):
        assert get(web, wait_path(done), token).status == 200
    measured["threads_before"] = threads_of(web.popen.pid)

    async def scenario() -> list[Stream]:
        waits = await held(web, run, token, n)
        measured["threads"] = threads_of(web.popen.pid)
        if ON_POSTGRESQL:
            measured["connections"] = await in_other_thread(
                lambda: query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", ["wait-many-web"]
                )
            )
        await in_other_thread(lambda: services.run_complete(run_id=run.pk, generation=run.generation, output="ok"))
        return await asyncio.gather(*waits)

    answers = asyncio.run(asyncio.wait_for(scenario(), 90))
    print(f"{n} waiters: {measured}")
    assert [json.loads(a.body)["wait_result"] for a in answers] == ["ended"] * n
    # No thread per waiter: at most the pools' threads beyond those already there.
    assert measured["threads"] <= measured["threads_before"] + 8
    if ON_POSTGRESQL:
        # The web process's pool and its LISTEN connection, never one per waiter.
        assert measured["connections"] <= settings.DEFAULT_DB_POOL_SIZE + 1
