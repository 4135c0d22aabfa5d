"""Bounded answers against a real web process: a stream replays and follows
big events in bounded reads without a gap, the Python client lists what was left out and pages
through big events, and six parallel 500-run pages of 255 kB inputs no longer take the web
process's memory, nor do the events pages of 62 MB of events a page's stream fills a gap from.
(The rules themselves, in process: tests/api/test_bounded_answers.py.)"""

import asyncio
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client as DjangoClient

from runledger_client import Client
from runs import services
from runs.events import EventType
from runs.models import Run, RunEvent
from tests.factories import running_run
from tests.support.db import token_for
from tests.support.memory import memory_kb, reset_peak
from tests.support.procs import Proc, Procs, subprocess_env
from tests.support.runs import assert_exact_log
from tests.support.sse import Event, Stream, auth_headers, stream_path
from tests.support.storage import big_events_run
from tests.support.threads import in_thread

pytestmark = [pytest.mark.sqlite, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

FIVE_MB = 5_000_000

# --- the stream's replay ---------------------------------------------------------------------------

# A small bound, so a few events of tens of kB make many reads; the feed's buffer (1 MB, trimmed at
# 2 MB) is passed by 40 events of 60 kB.
STREAM_PAGE_BYTES = 20_000


@pytest.fixture(scope="module")
def web(django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    registry = Procs(Path(tmp_path_factory.mktemp("bounded-web")))
    try:
        with django_db_blocker.unblock():
            env = subprocess_env(RUNLEDGER_MAX_PAGE_BYTES=str(STREAM_PAGE_BYTES))
        yield registry.uvicorn(env=env)
    finally:
        registry.stop_all()


async def read_to_end(web: Proc, run: Run, token: str, last_event_id: str | None = None) -> list[Event]:
    stream = await Stream(web.url, stream_path(run), auth_headers(token, last_event_id)).open()
    try:
        return [event async for event in stream.events()]
    finally:
        stream.close()


@pytest.mark.timeout(120)
def test_a_stream_replays_big_events_in_bounded_reads_with_no_gap(web: Proc, alice: User) -> None:
    run = big_events_run(alice, [30_000] * 12 + [10] * 50 + [50_000] * 3)
    token = token_for(alice)
    assert_exact_log(asyncio.run(read_to_end(web, run, token)), run)
    assert_exact_log(asyncio.run(read_to_end(web, run, token, last_event_id="7")), run, after=7)


@pytest.mark.timeout(120)
def test_live_watchers_of_big_events_past_the_feeds_buffer_miss_nothing(web: Proc, alice: User) -> None:
    run = running_run(alice)
    token = token_for(alice)

    def write() -> None:
        for batch in range(8):
            events = [(EventType.OUTPUT_DELTA, {"text": f"{batch}" * 60_000}) for _ in range(5)]
            services.run_events_append(run_id=run.pk, generation=run.generation, events=events)
        services.run_complete(run_id=run.pk, generation=run.generation, output={})

    async def scenario() -> tuple[list[Event], list[Event]]:
        live = await Stream(web.url, stream_path(run), auth_headers(token)).open()
        got: list[Event] = []
        writer: asyncio.Task[None] | None = None
        late: asyncio.Task[list[Event]] | None = None
        async for event in live.events():
            got.append(event)
            if event.seq == 2:  # run.started: the stream follows the live feed from here
                writer = asyncio.create_task(asyncio.to_thread(in_thread(write)))
            if event.seq == 20:  # a watcher joining midway reads the table behind the buffer
                late = asyncio.create_task(read_to_end(web, run, token))
        live.close()
        assert writer is not None and late is not None
        await writer
        return got, await late

    got, late = asyncio.run(scenario())
    assert_exact_log(got, run)
    assert_exact_log(late, run)


@pytest.mark.timeout(120)
def test_the_python_client_lists_what_was_left_out_and_reads_pages_of_big_events_to_the_end(
    web: Proc, alice: User
) -> None:
    big = services.run_create(owner=alice, agent="demo", input={"deltas": 1, "pad": "x" * 5000})
    with Client(web.url, token_for(alice)) as client:
        (listed_run,) = list(client.runs.list())
        assert (listed_run.id, listed_run["input"], listed_run.truncated) == (str(big.pk), None, ("input",))
        whole = client.runs.get(listed_run.id)
        assert (whole["input"]["pad"], whole.truncated) == ("x" * 5000, ())
        client.runs.cancel(listed_run.id)  # the next run claimed is the one below

        run = big_events_run(alice, [30_000] * 5)
        pages, after = [], 0
        while not pages or not pages[-1].end_of_stream:
            pages.append(client.runs.events(str(run.pk), after_seq=after, limit=1000))
            after = pages[-1].next_after_seq
    assert len(pages) > 1  # 20 kB a page on this web process
    assert [e.object for page in pages for e in page.events] == [e.as_dict() for e in RunEvent.objects.filter(run=run)]


# --- the attack ------------------------------------------------------------------------------------

# What six parallel 500-run pages may add to the web process's peak resident set. Measured on a
# 2-core machine: 710 MB before lists were bounded (300 MB → 1.14 GB in the report), about
# 6 MB after (bench/bounded_answers.py).
GROWTH_BOUND_MB = 100


@pytest.mark.timeout(300)
def test_six_parallel_pages_of_200_runs_with_255_kb_inputs_stay_small_and_keep_the_web_process_small(
    procs: Procs, alice: User
) -> None:
    for _ in range(200):
        run = services.run_create(owner=alice, agent="demo", input={"pad": "x" * 255_000})
        services.run_cancel(run_id=run.pk, actor=alice)  # finished: no active-runs cap holds them back
    web = procs.uvicorn(env=subprocess_env())
    headers = {"Authorization": f"Token {token_for(alice)}"}

    def page() -> httpx.Response:
        return httpx.get(f"{web.url}/api/runs/", params={"page_size": 500}, headers=headers, timeout=120)

    assert page().status_code == 200  # the first request loads what every request uses
    before = memory_kb(web.pid)["VmRSS"]
    reset_peak(web.pid)
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: page(), range(6)))
    growth_mb = (memory_kb(web.pid)["VmHWM"] - before) / 1024

    for answer in answers:
        assert answer.status_code == 200
        assert len(answer.content) <= FIVE_MB
        body = answer.json()
        assert body["next"] is None and len(body["results"]) == 200
        assert all(item["input"] is None and item["truncated"] == ["input"] for item in body["results"])
    assert growth_mb < GROWTH_BOUND_MB, f"the web process grew by {growth_mb:.0f} MB"


# The audit's view (the console's own events view then, whose live tail now fills a gap from the
# API's pages as the watch page does): 62 MB in one answer, and 170 MB more in the web process for it.
EVENTS_PAGES_GROWTH_BOUND_MB = 30


@pytest.mark.timeout(300)
def test_the_events_pages_a_staff_page_fills_a_gap_from_of_62_mb_of_events_stay_small_and_keep_the_web_process_small(
    procs: Procs, alice: User, make_user: Callable[..., User]
) -> None:
    staff = make_user("oncall", perms=("runs.view_run",), is_staff=True)
    run = big_events_run(alice, [250_000] * 250)
    web = procs.uvicorn(env=subprocess_env())
    browser = DjangoClient()
    browser.force_login(staff)
    cookies = {settings.SESSION_COOKIE_NAME: browser.cookies[settings.SESSION_COOKIE_NAME].value}

    def view(after_seq: int) -> httpx.Response:
        # What @runledger/client asks when it fills a gap: the most events a page may hold.
        url = f"{web.url}/api/runs/{run.pk}/events/"
        return httpx.get(url, params={"after_seq": after_seq, "limit": 1000}, cookies=cookies, timeout=120)

    assert view(run.last_seq - 1).status_code == 200  # the first request loads what every request uses
    before = memory_kb(web.pid)["VmRSS"]
    reset_peak(web.pid)
    answers, after = [], 0
    while not answers or not answers[-1].json()["end_of_stream"]:
        answers.append(view(after))
        after = answers[-1].json()["next_after_seq"]
    growth_mb = (memory_kb(web.pid)["VmHWM"] - before) / 1024

    sizes = [len(answer.content) for answer in answers]
    print(f"events pages: {len(answers)} pages, largest {max(sizes) / 1e6:.1f} MB, growth {growth_mb:.0f} MB")
    assert all(answer.status_code == 200 for answer in answers)
    assert max(sizes) <= FIVE_MB
    assert [e["seq"] for answer in answers for e in answer.json()["results"]] == list(range(1, run.last_seq + 1))
    assert growth_mb < EVENTS_PAGES_GROWTH_BOUND_MB, f"the web process grew by {growth_mb:.0f} MB"
