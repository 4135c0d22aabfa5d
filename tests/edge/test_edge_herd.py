"""A herd of watchers: 2,000 clients connecting within two seconds, as after a Pushpin
restart or a deploy, all get their stream — through bin/edge, and straight to a web process.

A client that gets anything but a 200 is lost for good: a browser's EventSource does not retry a
502, nor any answer but a 200 stream or a dropped connection."""

import asyncio
from collections import Counter
from collections.abc import Callable

import pytest
from django.contrib.auth.models import User

from runs.models import Run
from tests.factories import queued_run
from tests.support.db import token_for
from tests.support.edge import control_socket, edge_env, start_edge, wait_leading
from tests.support.procs import UNCAPPED, Procs, subprocess_env
from tests.support.runs import assert_exact_log
from tests.support.sse import Event, Stream, auth_headers, stream_path
from tests.support.workers import wait_status

# `alone`: bin/test runs these after the parallel pass, with the machine to themselves.
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.processes,
    pytest.mark.alone,
    pytest.mark.timeout(300),
]

HERD = 2000
WAVE = 200  # clients connecting at once, every PACE seconds
PACE = 0.2


async def one_watcher(base_url: str, path: str, headers: dict[str, str]) -> tuple[int | str, list[Event]]:
    """The client's status (with its answer's body, when not 200: whose refusal it was) and events."""
    stream = await Stream(base_url, path, headers).open(timeout=60)
    if stream.status != 200:
        return f"{stream.status} {stream.body[:80].decode(errors='replace').strip()}", []
    events: list[Event] = []
    try:
        async for data in stream.chunks():
            events.extend(stream.parser.feed(data))
    finally:
        stream.close()
    return 200, events


def herd(
    base_url: str, path: str, headers: dict[str, str], *, then: Callable[[], object]
) -> list[tuple[int | str, list[Event]]]:
    """HERD clients in waves of WAVE every PACE seconds (the shape of the load, not a wait for
    anything); `then` runs once all have been sent on their way."""

    async def scenario() -> list[tuple[int | str, list[Event]]]:
        tasks = []
        for _ in range(HERD // WAVE):
            tasks += [asyncio.create_task(one_watcher(base_url, path, headers)) for _ in range(WAVE)]
            await asyncio.sleep(PACE)
        await asyncio.to_thread(then)
        return list(await asyncio.wait_for(asyncio.gather(*tasks), 240))

    return asyncio.run(scenario())


def assert_every_client_got_the_whole_run(answers: list[tuple[int | str, list[Event]]], run: Run) -> None:
    statuses = Counter(status for status, _ in answers)
    assert statuses == {200: HERD}, statuses
    run = wait_status(run, "completed")
    for _, events in answers:
        assert_exact_log(events, run)


@pytest.mark.edge
def test_a_herd_of_2000_watchers_through_the_edge_all_get_every_event(procs: Procs, alice: User) -> None:
    control = control_socket()
    web = procs.uvicorn(env=edge_env(control, **UNCAPPED))
    wait_leading(web)
    # Warnings only, as a busy edge would log (not a line per request, which the 2,000 connects
    # and their link fetches would cost Pushpin's single-threaded parts while they hand them on).
    edge = start_edge(procs, upstream=web, control=control, log_level=1)
    run = queued_run(alice, input={"deltas": 40, "delay_ms": 100})
    answers = herd(edge.url, stream_path(run), auth_headers(token_for(alice)), then=lambda: procs.worker("herd"))
    assert_every_client_got_the_whole_run(answers, run)


def test_a_herd_of_2000_watchers_straight_to_a_web_process_all_get_every_event(procs: Procs, alice: User) -> None:
    web = procs.uvicorn(env=subprocess_env(**UNCAPPED))
    run = queued_run(alice, input={"deltas": 40, "delay_ms": 100})
    answers = herd(web.url, stream_path(run), auth_headers(token_for(alice)), then=lambda: procs.worker("herd"))
    assert_every_client_got_the_whole_run(answers, run)
