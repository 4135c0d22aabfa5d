"""The shared browser stream client (runs/static/runs/stream.js, docs/design/clients.md#browser) in
a real browser: Debian's Chromium through Playwright and a real uvicorn. No worker runs: the test
claims each run itself and writes its events through the services, as the worker would, so it knows
exactly what the stream carries.

EventSource only hands a named event to a listener for that name. The page listens for every
platform type and for the types the run's agent declared; an event of any other type (which a
worker would refuse, but a writer through the services can store) reaches the page only through
the gap it leaves in seq, filled from the events JSON pages.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, Request, expect

from runs import services
from runs.models import Run
from tests.factories import running_run
from tests.support.agents import AGENTS_ENV, PLAN_UPDATED
from tests.support.browser import give_password, save_screenshot, site_login
from tests.support.procs import Procs, subprocess_env
from tests.support.runs import event_types, stored_text

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

PASSWORD = "stream-client-pw"
WAIT_MS = 20_000


@dataclass
class Site:
    url: str
    page: Page
    user: User
    requests: list[str]

    def open(self, run: Run) -> None:
        self.page.goto(f"{self.url}/runs/{run.pk}/")

    def attr(self, name: str) -> str | None:
        return self.page.locator("#watch").get_attribute(f"data-{name}")

    def wait_attr(self, name: str, value: str) -> None:
        self.page.wait_for_function(
            "([name, value]) => document.getElementById('watch').dataset[name] === value",
            arg=[name, value],
            timeout=WAIT_MS,
        )

    def events_reads(self, run: Run) -> list[int]:
        """The cursors of the JSON events pages the page read for `run`, in request order."""
        prefix = f"{self.url}/api/runs/{run.pk}/events/?after_seq="
        return [int(url.removeprefix(prefix)) for url in self.requests if url.startswith(prefix)]


@pytest.fixture
def site(procs: Procs, browser_page: Page, alice: User) -> Iterator[Site]:
    web = procs.uvicorn(env=subprocess_env(**AGENTS_ENV))
    requests: list[str] = []

    def seen(request: Request) -> None:
        requests.append(request.url)

    browser_page.on("request", seen)
    give_password(alice, PASSWORD)
    site_login(browser_page, web.url, "alice", PASSWORD)
    yield Site(url=web.url, page=browser_page, user=alice, requests=requests)


def test_the_watch_page_shows_a_child_run_and_fills_the_gap_an_agents_own_event_type_leaves(site: Site) -> None:
    run = running_run(site.user)  # run.created, run.started
    site.open(run)
    site.wait_attr("connection", "live")
    site.wait_attr("lastSeq", "2")

    child = services.run_child_spawn(run_id=run.pk, generation=run.generation, input={"deltas": 1})
    child_line = f"Child run {str(child.pk)[:8]} started"
    expect(site.page.locator("#activity li").last).to_have_text(child_line, timeout=WAIT_MS)
    site.wait_attr("lastSeq", "3")

    # No listener hears custom.note (seq 4); the output.delta after it shows the gap.
    services.run_events_append(
        run_id=run.pk,
        generation=run.generation,
        events=[("custom.note", {"n": 1}), ("output.delta", {"text": "after the note"})],
    )
    site.wait_attr("lastSeq", "5")
    assert site.page.locator("#output").text_content() == "after the note"
    assert site.events_reads(run) == [3]  # the public JSON page, read once, from the gap's start

    services.run_stop(run_id=run.pk, actor=None, code="policy", reason="stopped by the platform")
    site.wait_attr("connection", "ended")
    run.refresh_from_db()
    assert run.last_seq == 6
    assert site.attr("last-seq") == str(run.last_seq)
    assert site.attr("status") == "stopped"
    # Each event rendered once: no line and no text twice.
    assert site.page.locator("#activity li").all_text_contents() == [
        "Created",
        "Started (attempt 1 on test-worker)",
        child_line,
        "Stopped: stopped by the platform",
    ]
    assert site.page.locator("#output").text_content() == stored_text(run)
    assert site.events_reads(run) == [3]
    save_screenshot(site.page, "watch-child-and-agent-type")


def test_a_type_the_runs_agent_declared_arrives_live_without_a_gap_fill(site: Site) -> None:
    run = running_run(site.user, agent="planner")
    site.open(run)
    site.wait_attr("connection", "live")
    site.wait_attr("lastSeq", "2")

    # Nothing follows it: only a listener for the declared type can deliver it.
    services.run_events_append(run_id=run.pk, generation=run.generation, events=[(PLAN_UPDATED, {"steps": 2})])
    site.wait_attr("lastSeq", "3")
    expect(site.page.locator("#activity li").last).to_have_text(PLAN_UPDATED, timeout=WAIT_MS)
    assert site.events_reads(run) == []


# Opens a second client on the watch page with the page's own vocabulary, recording everything it
# is told, through the module's public API.
OPEN_PROBE = """([streamUrl, eventsUrl]) => {
  window.probe = { seqs: [], types: [], states: [] };
  RunledgerStream.open({
    streamUrl, eventsUrl, afterSeq: 0,
    onEvent: (event) => { probe.seqs.push(event.seq); probe.types.push(event.type); },
    onState: (state, detail) => probe.states.push([state, detail === undefined ? null : String(detail)]),
  });
}"""


def test_the_client_delivers_every_event_once_in_seq_order_reading_as_many_pages_as_a_gap_needs(
    site: Site,
) -> None:
    run = running_run(site.user)
    site.open(run)
    site.wait_attr("connection", "live")
    site.page.evaluate(OPEN_PROBE, [f"/api/runs/{run.pk}/stream/", f"/api/runs/{run.pk}/events/"])
    site.page.wait_for_function("probe.states.some(([state]) => state === 'live')", timeout=WAIT_MS)

    # 250 events no listener hears, more than two JSON pages (100 events each by default), then
    # one that is heard, then the end.
    notes: list[tuple[str, dict[str, Any]]] = [("custom.note", {"n": n}) for n in range(250)]
    services.run_events_append(run_id=run.pk, generation=run.generation, events=notes)
    services.run_events_append(run_id=run.pk, generation=run.generation, events=[("output.delta", {"text": "done"})])
    services.run_complete(run_id=run.pk, generation=run.generation, output={"text": "done"})

    site.page.wait_for_function("probe.states.some(([state]) => state === 'ended')", timeout=WAIT_MS)
    site.wait_attr("connection", "ended")
    run.refresh_from_db()
    probe = site.page.evaluate("probe")
    assert probe["seqs"] == list(range(1, run.last_seq + 1))
    assert probe["types"] == event_types(run)
    states = probe["states"]
    assert states[0] == ["connecting", None] and states[-1] == ["ended", "completed"]
    assert not [state for state in states if state[0] in ("trouble", "disconnected")]
    # Each client (the page's and the probe) read the gap page by page from its start.
    assert sorted(set(site.events_reads(run))) == [2, 102, 202]
    assert site.attr("last-seq") == str(run.last_seq)
    assert site.attr("status") == "completed"
    assert site.page.locator("#output").text_content() == "done"


def test_a_client_of_chosen_types_gets_only_them_and_the_end_with_no_gap_fill(site: Site) -> None:
    run = running_run(site.user)
    site.open(run)
    site.wait_attr("connection", "live")
    site.page.evaluate(
        OPEN_PROBE.replace("afterSeq: 0,", "afterSeq: 0, types: ['output.delta'],"),
        [f"/api/runs/{run.pk}/stream/", f"/api/runs/{run.pk}/events/"],
    )
    site.page.wait_for_function("probe.states.some(([state]) => state === 'live')", timeout=WAIT_MS)
    calls: list[tuple[str, dict[str, Any]]] = []
    for n in range(30):
        calls += [("tool.started", {"call_id": f"c{n}", "name": "t"}), ("output.delta", {"text": f"{n} "})]
    services.run_events_append(run_id=run.pk, generation=run.generation, events=calls)
    services.run_complete(run_id=run.pk, generation=run.generation, output={"text": "done"})

    site.page.wait_for_function("probe.states.some(([state]) => state === 'ended')", timeout=WAIT_MS)
    run.refresh_from_db()
    probe = site.page.evaluate("probe")
    types = event_types(run)
    assert probe["seqs"] == [seq for seq, type_ in enumerate(types, 1) if type_ in ("output.delta", "run.completed")]
    assert probe["states"][-1] == ["ended", "completed"]
    assert any(f"/api/runs/{run.pk}/stream/?after_seq=0&types=output.delta" in url for url in site.requests)
    assert not [url for url in site.requests if "/events/" in url and "types=" in url]  # no gap filled


# A client of the module's own on the page, for a stream the server refuses.
OPEN_REFUSED = """([streamUrl, eventsUrl]) => {
  window.refused = { states: [] };
  RunledgerStream.open({
    streamUrl, eventsUrl, afterSeq: 0, retryClosedMs: 200,
    onEvent: () => {},
    onState: (state, detail) => refused.states.push([state, detail === undefined ? null : String(detail)]),
  });
}"""


@pytest.mark.parametrize("refusal", ["404", "401"])
def test_a_stream_refused_for_good_stops_retrying_and_says_why(site: Site, refusal: str) -> None:
    run = running_run(site.user)
    site.open(run)
    site.wait_attr("connection", "live")
    run_id = str(run.pk)
    if refusal == "404":
        run_id = str(uuid4())  # no such run
    else:
        site.page.context.clear_cookies()  # signed out
    urls = [f"/api/runs/{run_id}/stream/", f"/api/runs/{run_id}/events/"]

    def stream_requests() -> int:
        return len([u for u in site.requests if u.startswith(f"{site.url}{urls[0]}")])

    before = stream_requests()  # the page's own stream of the run
    site.page.evaluate(OPEN_REFUSED, urls)

    site.page.wait_for_function("refused.states.some(([state]) => state === 'stopped')", timeout=WAIT_MS)
    why = {"404": "no such run (404)", "401": "not signed in (401)"}[refusal]
    assert site.page.evaluate("refused.states") == [["connecting", None], ["stopped", why]]
    # Many retry intervals later, still the one stream request: it never retried.
    site.page.wait_for_timeout(1500)
    assert stream_requests() == before + 1
