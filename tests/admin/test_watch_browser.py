"""The watch page in a real browser: Debian's Chromium through Playwright, a real uvicorn and a
real worker, with a cuttable loopback proxy between the browser and uvicorn
(docs/design/clients.md#watch-page).

Network drops are made on the server side by the proxy, which also records the request heads the
server receives (to see each reconnect ask for the events after the last one shown); going offline
is Playwright's `set_offline`, which fails the page's new connections.
"""

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from runs import services
from runs.models import Run, RunAttempt, RunEvent
from tests.support.browser import BROWSER_TESTS, give_password, save_screenshot
from tests.support.procs import Procs
from tests.support.proxies import CuttableProxy, SeenRequest
from tests.support.runs import status_of, stored_text
from tests.support.waiting import wait_until

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = BROWSER_TESTS

PASSWORD = "watch-page-pw"


@dataclass
class Site:
    proxy: CuttableProxy
    page: "Page"
    user: User

    def open(self, run: Run) -> None:
        self.page.goto(f"{self.proxy.url}/runs/{run.pk}/")

    def watch(self, seen: int, **input: Any) -> Run:
        """A new demo run of the user's (`input` over demo_run's), open here, `seen` events shown."""
        run = demo_run(self.user, **input)
        self.open(run)
        self.wait_seq_at_least(seen)
        return run

    def attr(self, name: str) -> str | None:
        return self.page.locator("#watch").get_attribute(f"data-{name}")

    def wait_attr(self, name: str, value: str, timeout: float = 20_000) -> None:
        self.page.wait_for_function(
            "([name, value]) => document.getElementById('watch').dataset[name] === value",
            arg=[name, value],
            timeout=timeout,
        )

    def wait_seq_at_least(self, seq: int, timeout: float = 20_000) -> None:
        self.page.wait_for_function(
            "n => Number(document.getElementById('watch').dataset.lastSeq || 0) >= n", arg=seq, timeout=timeout
        )

    def output(self) -> str:
        return str(self.page.locator("#output").text_content())


@pytest.fixture
def site(procs: Procs, browser_page: "Page", alice: User) -> Iterator[Site]:
    web = procs.uvicorn()
    procs.worker("watch-w1", concurrency=4)
    proxy = CuttableProxy(upstream_port=int(web.port or 0)).start()
    try:
        give_password(alice, PASSWORD)
        browser_page.goto(f"{proxy.url}/accounts/login/?next=/runs/")
        browser_page.fill("#id_username", "alice")
        browser_page.fill("#id_password", PASSWORD)
        browser_page.click("button[type=submit]")
        browser_page.wait_for_url(f"{proxy.url}/runs/")
        yield Site(proxy=proxy, page=browser_page, user=alice)
    finally:
        proxy.stop()


def demo_run(owner: User, **input: Any) -> Run:
    return services.run_create(owner=owner, agent="demo", input={"deltas": 40, "delay_ms": 50} | input)


def after_seq(request: SeenRequest) -> int:
    """The cursor a stream request asked for."""
    return int(parse_qs(urlsplit(request.path).query)["after_seq"][0])


def test_a_cut_connection_reconnects_after_the_last_event_shown_and_the_text_is_exact(site: Site) -> None:
    run = demo_run(site.user, deltas=120, delay_ms=40)
    site.open(run)
    site.wait_attr("connection", "live")
    for cut in range(2):
        site.wait_seq_at_least(8 + 20 * cut)
        assert site.proxy.cut_streams() >= 1
        assert status_of(run) == "running"  # the drop is mid-stream, and it ends nothing
        # The page reconnected by itself: the server saw a new stream request, and the page is
        # live again — or already past the end, when the replay carried the terminal event.
        site.page.wait_for_function(
            "n => ['live', 'ended'].includes(document.getElementById('watch').dataset.connection)"
            " && Number(document.getElementById('watch').dataset.lastSeq || 0) >= n",
            arg=8 + 20 * cut,
            timeout=20_000,
        )
        wait_until(lambda cut=cut: len(site.proxy.stream_requests()) >= cut + 2, what="the reconnect")
    site.wait_attr("status", "completed", timeout=30_000)

    first, *reconnects = [after_seq(r) for r in site.proxy.stream_requests()]
    # Each reconnect asked for the events after the last one the page had shown.
    assert first == 0 and len(reconnects) >= 2
    assert all(seq >= 8 for seq in reconnects) and reconnects == sorted(reconnects)
    assert site.output() == stored_text(run) != ""
    assert RunEvent.objects.filter(run=run, type="run.cancelled").count() == 0
    save_screenshot(site.page, "watch-after-reconnects")


def test_a_reload_mid_stream_catches_up_and_the_run_keeps_running(site: Site) -> None:
    run = site.watch(10, deltas=80, delay_ms=40)
    site.page.reload()
    assert status_of(run) == "running"  # closing the page's stream did not end the run
    site.wait_attr("connection", "live")
    site.wait_attr("status", "completed", timeout=30_000)
    assert site.output() == stored_text(run) != ""
    assert Run.objects.get(pk=run.pk).end_code == ""
    # The final facts, as committed, without a reload.
    expect(site.page.locator("#result")).to_contain_text('"deltas":80', timeout=10_000)
    expect(site.page.locator("#ended")).to_contain_text("completed at ")


def test_going_offline_and_back_resumes_after_the_last_event_shown_and_the_run_never_stops(site: Site) -> None:
    run = site.watch(8, deltas=150, delay_ms=40)
    site.page.context.set_offline(True)
    site.proxy.cut_streams()  # what the open connection does offline is the browser's affair
    site.wait_attr("connection", "reconnecting")
    shown = int(site.attr("last-seq") or 0)
    asked = len(site.proxy.stream_requests())
    # The run goes on while the page cannot hear it; the page goes on trying.
    wait_until(lambda: Run.objects.get(pk=run.pk).last_seq >= shown + 10, what="events while offline")
    assert status_of(run) == "running"
    assert site.attr("connection") == "reconnecting" and site.attr("last-seq") == str(shown)

    site.page.context.set_offline(False)
    site.wait_attr("status", "completed", timeout=30_000)
    # The first stream request that reached the server asked for what followed the last event shown.
    assert after_seq(site.proxy.stream_requests()[asked]) == shown
    assert site.output() == stored_text(run) != ""
    assert RunEvent.objects.filter(run=run, type="run.cancelled").count() == 0
    save_screenshot(site.page, "watch-after-offline")


def test_stop_cancels_once_and_shows_when_the_worker_released_the_run(site: Site) -> None:
    run = site.watch(6, deltas=400, delay_ms=50)
    site.page.click("#stop")
    site.wait_attr("status", "cancelled")
    assert site.page.locator("#stop-state").text_content() == "cancelled"
    assert site.page.locator("#stop").is_disabled()

    events = list(RunEvent.objects.filter(run=run).order_by("seq"))
    assert [e.type for e in events].count("run.cancelled") == 1
    assert events[-1].type == "run.cancelled"
    assert events[-1].data["code"] == "cancelled_by_user"
    attempt = wait_until(
        lambda: RunAttempt.objects.filter(run=run, released_at__isnull=False).first(), what="the release"
    )
    assert attempt.outcome == "cancelled"
    site.wait_attr("released", "yes")
    assert "released at" in str(site.page.locator("#released").text_content())
    # The page rendered exactly what is stored, up to the cancel.
    assert site.output() == stored_text(run)
    save_screenshot(site.page, "watch-stopped")


def test_stop_after_the_run_completed_unseen_shows_the_committed_state(site: Site) -> None:
    run = site.watch(6, deltas=400, delay_ms=50)
    site.proxy.cut_streams(hold=True)  # the page can no longer hear the run
    site.wait_attr("connection", "reconnecting")
    generation = Run.objects.get(pk=run.pk).generation
    services.run_complete(run_id=run.pk, generation=generation, output={"text": "finished elsewhere"})

    site.page.click("#stop")
    site.wait_attr("status", "completed")
    assert site.page.locator("#stop-state").text_content() == "the run had already completed"
    assert RunEvent.objects.filter(run=run, type="run.cancelled").count() == 0
    assert status_of(run) == "completed"
    save_screenshot(site.page, "watch-stop-lost-the-race")
    site.proxy.restore()


def test_a_waiting_run_is_answered_from_the_page_and_completes(site: Site) -> None:
    run = demo_run(site.user, deltas=10, delay_ms=20, ask="What is your name?")
    site.open(run)
    site.page.locator("#resume-form").wait_for(state="visible")
    assert site.page.locator("#prompt").text_content() == "What is your name?"
    assert status_of(run) == "waiting"
    site.page.fill("#resume-input", "Ada")
    site.page.click("#resume")
    site.wait_attr("status", "completed")
    done = Run.objects.get(pk=run.pk)
    assert done.output["answer"] == "Ada"
    assert site.page.locator("#resume-form").is_hidden()
    assert site.output() == stored_text(run)
    save_screenshot(site.page, "watch-answered")


def test_a_steps_retries_and_completions_are_shown_as_they_happen(site: Site) -> None:
    run = demo_run(site.user, deltas=6, delay_ms=20, tool="slow", tool_ms=50, flaky=2, steps=True)
    site.open(run)
    site.wait_attr("status", "completed")
    lines = [str(text) for text in site.page.locator("#activity li").all_text_contents()]
    retrying = [line for line in lines if line.startswith("Step tool failed")]
    assert len(retrying) == 2, lines
    assert all(
        re.fullmatch(r"Step tool failed \(RetryableError: the slow tool is busy\); retrying in \d+\.\d s", r)
        for r in retrying
    )
    assert [line for line in lines if line.endswith(" done")] == [
        "Step model done",
        "Step tool done",
        "Step model done",
    ]
    assert site.output() == stored_text(run)
    save_screenshot(site.page, "watch-step-retries")


def test_the_pages_fit_a_phone_screen(site: Site) -> None:
    run = demo_run(site.user, deltas=30, delay_ms=0, tool="slow", tool_ms=10)
    site.page.set_viewport_size({"width": 390, "height": 844})
    for url, name in ((f"/runs/{run.pk}/", "watch-phone"), ("/runs/", "run-list-phone")):
        site.page.goto(site.proxy.url + url)
        if name == "watch-phone":
            site.wait_attr("status", "completed")
        # Nothing wider than the screen: no sideways scrolling on a phone.
        assert site.page.evaluate("document.documentElement.scrollWidth") <= 390
        save_screenshot(site.page, name)


def test_stop_of_a_run_whose_worker_died_shows_the_release_once_its_lease_lapses(site: Site, procs: Procs) -> None:
    run = site.watch(6, deltas=400, delay_ms=50)
    worker = next(p for p in procs.started if p.name == "worker-watch-w1")
    worker.kill()
    site.page.click("#stop")
    site.wait_attr("status", "cancelled")
    expect(site.page.locator("#released")).to_contain_text("not yet (the worker's lease lapses at ", timeout=20_000)

    procs.worker("watch-w2")  # its sweeper finds the lapsed lease

    site.wait_attr("released", "yes", timeout=30_000)
    attempt = RunAttempt.objects.get(run=run)
    assert attempt.outcome == "lost" and attempt.released_at == attempt.lease_expires_at
    text = str(site.page.locator("#released").text_content())
    assert text.startswith("released at ") and text.endswith("(its worker was lost; its lease lapsed then)")
