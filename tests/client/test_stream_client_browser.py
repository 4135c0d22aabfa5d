"""The app's pages' stream client — @runledger/client's browser build, runs/static/runs/runledger-client.js
(docs/design/clients.md#browser) — in a real browser: Debian's Chromium through Playwright and a
real uvicorn. No worker runs: the test claims each run itself and writes its events through the
services, as the worker would, so it knows exactly what the stream carries.

The client reads the stream on fetch and parses its frames itself, so it hears every event of any
type as it comes, an agent's own types too: no gap is left to fill. The server never makes one;
to see the client fill one, a test hands the browser a stream with events taken out.
"""

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit
from uuid import uuid4

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, Request, Response, Route, expect

from runs import services
from runs.models import Run
from tests.factories import running_run
from tests.support.agents import AGENTS_ENV, PLAN_UPDATED
from tests.support.browser import BROWSER_TESTS, give_password, save_screenshot, site_login
from tests.support.procs import Procs, subprocess_env
from tests.support.runs import event_types, stored_text

pytestmark = BROWSER_TESTS

PASSWORD = "stream-client-pw"
WAIT_MS = 20_000
# A small bound on an events page, so that filling a gap of 250 events takes several pages.
PAGE_BYTES = 10_000


@dataclass
class Site:
    url: str
    page: Page
    user: User
    requests: list[str]
    events_pages: list[dict[str, Any]] = field(default_factory=list)

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
        path = f"/api/runs/{run.pk}/events/"
        reads = [urlsplit(url) for url in self.requests if url.startswith(f"{self.url}{path}")]
        return [int(parse_qs(read.query)["after_seq"][0]) for read in reads]

    def stream_requests(self, run_id: str) -> list[str]:
        return [url for url in self.requests if url.startswith(f"{self.url}/api/runs/{run_id}/stream/")]


@pytest.fixture
def site(procs: Procs, browser_page: Page, alice: User) -> Iterator[Site]:
    web = procs.uvicorn(env=subprocess_env(**AGENTS_ENV, RUNLEDGER_MAX_PAGE_BYTES=str(PAGE_BYTES)))
    requests: list[str] = []
    events_pages: list[dict[str, Any]] = []

    def seen(request: Request) -> None:
        requests.append(request.url)

    def answered(response: Response) -> None:
        if "/events/" in response.url and response.ok:
            events_pages.append(response.json())

    browser_page.on("request", seen)
    browser_page.on("response", answered)
    give_password(alice, PASSWORD)
    site_login(browser_page, web.url, "alice", PASSWORD)
    yield Site(url=web.url, page=browser_page, user=alice, requests=requests, events_pages=events_pages)


def test_the_watch_page_hears_a_child_run_and_an_agents_own_event_type_with_no_gap_to_fill(site: Site) -> None:
    run = running_run(site.user)  # run.created, run.started
    site.open(run)
    site.wait_attr("connection", "live")
    site.wait_attr("lastSeq", "2")

    child = services.run_child_spawn(run_id=run.pk, generation=run.generation, input={"deltas": 1})
    child_line = f"Child run {str(child.pk)[:8]} started"
    expect(site.page.locator("#activity li").last).to_have_text(child_line, timeout=WAIT_MS)
    site.wait_attr("lastSeq", "3")

    # A type the run's agent never declared, with nothing after it: it arrives as it is committed.
    services.run_events_append(run_id=run.pk, generation=run.generation, events=[("custom.note", {"n": 1})])
    site.wait_attr("lastSeq", "4")
    services.run_events_append(run_id=run.pk, generation=run.generation, events=[("output.delta", {"text": "after"})])
    site.wait_attr("lastSeq", "5")
    assert site.page.locator("#output").text_content() == "after"

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
    assert site.events_reads(run) == []  # every event came on the stream
    assert site.page.locator("#connection").text_content() == "ended"
    save_screenshot(site.page, "watch-child-and-agent-type")


def test_a_type_the_runs_agent_declared_arrives_live_and_is_shown(site: Site) -> None:
    run = running_run(site.user, agent="planner")
    site.open(run)
    site.wait_attr("connection", "live")
    site.wait_attr("lastSeq", "2")

    services.run_events_append(run_id=run.pk, generation=run.generation, events=[(PLAN_UPDATED, {"steps": 2})])
    site.wait_attr("lastSeq", "3")
    expect(site.page.locator("#activity li").last).to_have_text(PLAN_UPDATED, timeout=WAIT_MS)
    assert site.events_reads(run) == []


# A second stream on the page, through the package's public API, recording everything it is told:
# window[name] = {seqs, types, states: [[state, reason or final status]], error (its class), done}.
OPEN_PROBE = """([name, runId, options]) => {
  const probe = (window[name] = { seqs: [], types: [], states: [], error: null, done: false });
  const detail = (c) => (c.state === "refused" ? c.reason : c.state === "ended" ? c.status : null);
  const client = new Runledger.Client({ baseUrl: "" });
  const stream = client.runs.stream(runId, { ...options, onState: (c) => probe.states.push([c.state, detail(c)]) });
  (async () => {
    try {
      for await (const event of stream) {
        probe.seqs.push(event.seq);
        probe.types.push(event.type);
      }
    } catch (error) {
      probe.error = error.name;
    }
    probe.done = true;
  })();
}"""


def probe(site: Site, name: str, run_id: str, **options: Any) -> dict[str, Any]:
    """A probe `name` of `run_id`'s stream (with the package's `options`), read to its end."""
    site.page.evaluate(OPEN_PROBE, [name, run_id, options])
    site.page.wait_for_function(f"window[{name!r}].done", timeout=WAIT_MS)
    found: dict[str, Any] = site.page.evaluate(f"window[{name!r}]")
    return found


def without_frames(body: str, seqs: range) -> str:
    """The SSE text `body` without the frames of the events `seqs`."""
    frames = body.split("\n\n")
    return "\n\n".join(f for f in frames if not any(line == f"id: {seq}" for seq in seqs for line in f.split("\n")))


def test_a_stream_missing_events_is_filled_from_the_events_pages_one_bounded_page_after_another(site: Site) -> None:
    shown = running_run(site.user)  # a page with the client on it
    site.open(shown)
    site.wait_attr("connection", "live")
    run = running_run(site.user)
    notes: list[tuple[str, dict[str, Any]]] = [("custom.note", {"n": n, "pad": "x" * 60}) for n in range(250)]
    services.run_events_append(run_id=run.pk, generation=run.generation, events=notes)
    services.run_events_append(run_id=run.pk, generation=run.generation, events=[("output.delta", {"text": "done"})])
    services.run_complete(run_id=run.pk, generation=run.generation, output={"text": "done"})
    run.refresh_from_db()
    missing = range(3, 253)  # the notes

    def cut(route: Route) -> None:
        answer = route.fetch()  # the ended run's whole stream
        route.fulfill(response=answer, body=without_frames(answer.text(), missing))

    site.page.route(f"**/api/runs/{run.pk}/stream/**", cut)
    found = probe(site, "filled", str(run.pk))

    assert found["seqs"] == list(range(1, run.last_seq + 1))
    assert found["types"] == event_types(run)
    assert found["states"] == [["connecting", None], ["live", None], ["ended", "completed"]]
    assert found["error"] is None
    # Read from the gap's start, each page from where the last one ended, each within the bound.
    reads, pages = site.events_reads(run), site.events_pages
    assert len(reads) >= 3 and reads[0] == 2
    assert reads[1:] == [page["next_after_seq"] for page in pages[:-1]]
    assert pages[-1]["next_after_seq"] >= missing[-1]
    assert len(site.stream_requests(str(run.pk))) == 1


def test_a_client_of_chosen_types_gets_only_them_and_the_end_with_no_gap_fill(site: Site) -> None:
    run = running_run(site.user)
    site.open(run)
    site.wait_attr("connection", "live")
    site.page.evaluate(OPEN_PROBE, ["chosen", str(run.pk), {"types": ["output.delta"]}])
    site.page.wait_for_function("chosen.states.some(([state]) => state === 'live')", timeout=WAIT_MS)
    calls: list[tuple[str, dict[str, Any]]] = []
    for n in range(30):
        calls += [("tool.started", {"call_id": f"c{n}", "name": "t"}), ("output.delta", {"text": f"{n} "})]
    services.run_events_append(run_id=run.pk, generation=run.generation, events=calls)
    services.run_complete(run_id=run.pk, generation=run.generation, output={"text": "done"})

    site.page.wait_for_function("chosen.done", timeout=WAIT_MS)
    run.refresh_from_db()
    found = site.page.evaluate("chosen")
    types = event_types(run)
    assert found["seqs"] == [seq for seq, type_ in enumerate(types, 1) if type_ in ("output.delta", "run.completed")]
    assert found["states"] == [["connecting", None], ["live", None], ["ended", "completed"]]
    assert f"{site.url}/api/runs/{run.pk}/stream/?after_seq=0&types=output.delta" in site.requests
    assert site.events_reads(run) == []  # its seqs have gaps of their own: none is filled
    # The page's own stream of the run: every event, and the text they make.
    site.wait_attr("lastSeq", str(run.last_seq))
    assert site.page.locator("#output").text_content() == stored_text(run)


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
    before = len(site.stream_requests(run_id))  # the page's own stream of the run

    found = probe(site, "refused", run_id)

    why, error = {"404": ("no such run (404)", "NotFound"), "401": ("not signed in (401)", "AuthenticationError")}[
        refusal
    ]
    assert found["states"] == [["connecting", None], ["refused", why]]
    assert (found["error"], found["seqs"]) == (error, [])
    # Many retry intervals later (its backoff starts at 200 ms), still the one stream request.
    site.page.wait_for_timeout(1500)
    assert len(site.stream_requests(run_id)) == before + 1


def test_an_ended_runs_stream_reads_to_its_end_one_past_it_ends_at_the_204_and_a_bad_type_is_refused(
    site: Site,
) -> None:
    ended = running_run(site.user)
    notes: list[tuple[str, dict[str, Any]]] = [("custom.note", {"n": n}) for n in range(250)]
    services.run_events_append(run_id=ended.pk, generation=ended.generation, events=notes)
    services.run_complete(run_id=ended.pk, generation=ended.generation, output=None)
    ended.refresh_from_db()
    shown = running_run(site.user)  # a page with the client on it
    site.open(shown)
    site.wait_attr("connection", "live")

    whole = probe(site, "whole", str(ended.pk))
    assert whole["seqs"] == list(range(1, ended.last_seq + 1))
    assert whole["states"] == [["connecting", None], ["live", None], ["ended", "completed"]]

    past = probe(site, "past", str(ended.pk), afterSeq=ended.last_seq)
    assert (past["seqs"], past["error"]) == ([], None)
    assert past["states"] == [["connecting", None], ["ended", None]]

    bad = probe(site, "bad", str(ended.pk), types=["no.such"])
    assert (bad["seqs"], bad["error"]) == ([], "ValidationError")
    [connecting, (state, reason)] = bad["states"]
    assert connecting == ["connecting", None] and state == "refused"
    assert "no.such" in reason and reason.endswith("(400)"), reason
    assert len(site.stream_requests(str(ended.pk))) == 3
    assert site.events_reads(ended) == []
