"""Streams and pages of chosen event types (`?types=`, docs/design/streaming.md#types): only the
events of those types and the terminal one, each with its own seq, so that a resume by `after_seq`
or `Last-Event-ID` stays exact; unknown names are a 400 naming them.

The pages are read in process (the Django test client); the proof that a stream of deltas cut at
random points loses and repeats nothing goes through a uvicorn, with a writer in a third process
(as tests/streaming/test_sse_resilience.py does for every event). The stream's contract with `types` is in
tests/streaming/test_sse.py.
"""

import asyncio
import random
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from runs import services
from runs.events import TERMINAL_EVENT_TYPES, EventType
from runs.models import Run
from tests.factories import running_run
from tests.support.db import token_for
from tests.support.procs import Proc, Procs, start_writer
from tests.support.runs import chosen_seqs, mixed_run
from tests.support.seed import SEED
from tests.support.sse import Event, Stream, auth_headers

pytestmark = [pytest.mark.sqlite, pytest.mark.django_db(transaction=True)]

DELTA, STARTED, FINISHED = EventType.OUTPUT_DELTA.value, EventType.TOOL_STARTED.value, EventType.TOOL_FINISHED.value


def page(client: Client, run: Run, query: str) -> dict[str, Any]:
    response = client.get(f"/api/runs/{run.pk}/events/?{query}")
    assert response.status_code == 200, response.content
    return response.json()


def test_a_page_of_chosen_types_has_only_them_and_the_terminal_event_with_their_own_seqs(alice: User) -> None:
    run = mixed_run(alice)
    client = Client()
    client.force_login(alice)
    got = page(client, run, f"types={DELTA}&limit=1000")
    assert [e["seq"] for e in got["results"]] == chosen_seqs(run, DELTA)
    assert {e["type"] for e in got["results"]} == {DELTA, EventType.RUN_COMPLETED}
    assert got["end_of_stream"] is True and got["next_after_seq"] == run.last_seq
    # Prefixes and exact names together; spaces around the commas are nothing.
    got = page(client, run, f"types=run.*, {FINISHED}")
    assert [e["seq"] for e in got["results"]] == chosen_seqs(run, FINISHED, prefixes=("run.",))
    # Paged by `limit` from any cursor: the first `limit` chosen events after it, however far apart.
    cursor, seen = 4, []
    while True:
        got = page(client, run, f"types={STARTED}&limit=2&after_seq={cursor}")
        assert len(got["results"]) <= 2
        seen += [e["seq"] for e in got["results"]]
        cursor = got["next_after_seq"]
        if got["end_of_stream"]:
            break
    assert seen == [seq for seq in chosen_seqs(run, STARTED) if seq > 4]
    # Every event's JSON is the one the unfiltered page has.
    everything = {e["seq"]: e for e in page(client, run, "limit=1000")["results"]}
    assert all(everything[e["seq"]] == e for e in page(client, run, f"types={STARTED}")["results"])


def test_unknown_types_are_a_400_naming_every_one_and_an_agents_own_types_are_known(
    alice: User, agent_named: Any
) -> None:
    client = Client()
    client.force_login(alice)
    run = mixed_run(alice)
    for query, named in (
        ("types=output.delta,nope.x,tool.*,zz.*", "nope.x, zz.*"),
        ("types=*", "*"),
        ("types=runner.*", "runner.*"),
    ):
        response = client.get(f"/api/runs/{run.pk}/events/?{query}")
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["code"] == "validation_error" and named in error["message"]
        assert list(error["detail"]) == ["types"]
    assert client.get(f"/api/runs/{run.pk}/events/?types=,").json()["error"]["detail"]["types"]
    # Empty, as a form leaves it: every event.
    assert len(page(client, run, "types=&limit=1000")["results"]) == run.last_seq
    # A type the run's agent declared is known for its runs; a prefix's `_` is no wildcard.
    agent = agent_named("typed", lambda ctx: None, event_types=["a_b.c", "axb.c"])
    own = running_run(alice, agent=agent, input={})
    services.run_events_append(
        run_id=own.pk, generation=own.generation, events=[("a_b.c", {}), ("axb.c", {}), (DELTA, {"text": "x"})]
    )
    got = page(client, own, "types=a_b.*")
    assert [e["type"] for e in got["results"]] == ["a_b.c"]
    assert [e["type"] for e in page(client, own, "types=axb.c")["results"]] == ["axb.c"]
    assert client.get(f"/api/runs/{run.pk}/events/?types=a_b.c").status_code == 400  # not the demo's


@pytest.mark.processes
def test_a_stream_of_deltas_cut_200_times_at_random_points_delivers_each_delta_once_in_order(
    procs: Procs, alice: User
) -> None:
    print(f"seed {SEED}")
    rng = random.Random(SEED)
    web = procs.uvicorn()
    token = token_for(alice)
    cuts = rounds = 0
    while cuts < 200 and rounds < 4:
        run = running_run(alice)
        writer = start_writer(procs, run, count=220, seed=SEED + rounds, pause_ms=5, mixed=True)
        got, round_cuts = asyncio.run(asyncio.wait_for(cut_often(web, run, token, rng), 90))
        writer.wait_exit()
        run.refresh_from_db()
        assert [e.seq for e in got] == chosen_seqs(run, DELTA), f"seed {SEED}"
        assert [e.event for e in got[:-1]] == [DELTA] * (len(got) - 1)
        assert got[-1].event == EventType.RUN_COMPLETED  # the terminal one, last
        print(f"round {rounds}: {len(got)} events, {round_cuts} cuts")
        cuts += round_cuts
        rounds += 1
    assert cuts >= 200, f"seed {SEED}"


async def cut_often(web: Proc, run: Run, token: str, rng: random.Random) -> tuple[list[Event], int]:
    got: list[Event] = []
    last_id: str | None = None
    cuts = 0
    for _ in range(5000):
        path = f"/api/runs/{run.pk}/stream/?after_seq=0&types={DELTA}"
        stream = await Stream(web.url, path, auth_headers(token, last_id)).open()
        assert stream.status == 200, (stream.status, stream.body)
        budget = rng.randint(0, 60) if rng.random() < 0.25 else rng.randint(0, 700)
        async for event in stream.events(byte_budget=budget):
            got.append(event)
        stream.close()
        last_id = stream.parser.last_event_id or last_id
        cuts += stream.dropped
        if got and got[-1].event in TERMINAL_EVENT_TYPES:
            break
    return got, cuts
