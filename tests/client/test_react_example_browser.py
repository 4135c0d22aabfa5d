"""The React example app (clients/js/examples/react-app, docs/how-to/frontend.md) in Chromium: built
from the package with esbuild, served by a server of its own on another origin than Runledger (as a
dev server would be), calling the standalone site with a token through a proxy that records every
request and can cut the stream. The site allows the app's origin as docs/how-to/cross-origin.md
says (DJANGO_CORS_ALLOWED_ORIGINS).

What a user of the page sees, checked against the database: the run's text appears as it streams;
a reload, a network gone and back, or a cut connection resume it with every event once (the events
the page holds are the stored log); Stop ends it with one `run.cancelled`; closing the tab leaves it
running to its end. Without the CORS settings, or from an origin not listed, the page shows the
failure and the server made nothing; a token it refuses shows the stream refused, with the reason.
"""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from runs.models import Run, RunEvent
from tests.factories import queued_run
from tests.support.browser import BROWSER_TESTS, save_screenshot
from tests.support.db import token_for
from tests.support.live import LIVE_ENV, cut_budgets, mid_frame
from tests.support.node import built_example
from tests.support.other_origin import OtherOrigin
from tests.support.procs import Proc, Procs, subprocess_env
from tests.support.proxies import CuttableProxy
from tests.support.runs import status_of, stored_text
from tests.support.seed import SEED
from tests.support.waiting import wait_until

pytestmark = [*BROWSER_TESTS, pytest.mark.timeout(120)]

LISTED = "127.0.0.1"  # the app's host in the origin the site lists; "localhost" is another origin
WAIT_MS = 20_000


@dataclass
class Sites:
    listed: Proc  # the app's origin allowed
    closed: Proc  # no CORS settings: the default
    app: OtherOrigin


@pytest.fixture(scope="module")
def sites(django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sites]:
    example = built_example()
    files = {"/": (example / "index.html").read_bytes(), "/dist/app.js": (example / "dist" / "app.js").read_bytes()}
    registry = Procs(Path(tmp_path_factory.mktemp("react-example")))
    with OtherOrigin(files) as app:
        try:
            with django_db_blocker.unblock():
                env = subprocess_env(**LIVE_ENV)  # reconnects after 20 ms, not 2 s
            listed = registry.uvicorn(env=env | {"DJANGO_CORS_ALLOWED_ORIGINS": app.origin(LISTED)})
            closed = registry.uvicorn(env=env)
            registry.worker("react-example", concurrency=4, env=env)
            yield Sites(listed=listed, closed=closed, app=app)
        finally:
            registry.stop_all()


@dataclass
class App:
    """The example in a browser tab, configured to call a site through `proxy`."""

    page: Page
    proxy: CuttableProxy
    origin: str
    token: str

    def open(self, run_id: str | None = None) -> None:
        self.page.goto(self.origin + "/" + ("" if run_id is None else f"?run={run_id}"))

    def start(self, **input: int) -> Run:
        """Start a demo run from the page's form; the run, once the page shows it (its id in the URL)."""
        self.page.fill("#input", json.dumps(input))
        self.page.click("#start")
        self.page.wait_for_url("**/?run=*", timeout=WAIT_MS)
        return Run.objects.get(pk=self.page.url.rsplit("=", 1)[1])

    def streams(self) -> list[str]:
        """The paths of the stream requests the page sent (their preflights aside)."""
        return [seen.path for seen in self.proxy.stream_requests() if seen.method == "GET"]

    def events(self) -> list[tuple[int, str]]:
        """The events the page holds, as its hidden list renders them: (seq, type)."""
        found = self.page.eval_on_selector_all("#events li", "found => found.map(e => [e.dataset.seq, e.dataset.type])")
        return [(int(seq), kind) for seq, kind in found]

    def wait_events(self, at_least: int) -> None:
        self.page.wait_for_function(
            "n => document.querySelectorAll('#events li').length >= n", arg=at_least, timeout=WAIT_MS
        )

    def wait_shown(self, field: str, value: str) -> None:
        self.page.wait_for_function(
            "([field, value]) => document.getElementById('run')?.dataset[field] === value",
            arg=[field, value],
            timeout=WAIT_MS,
        )

    def assert_shows_the_stored_log(self, run: Run) -> None:
        """Every event of the run once, in order, and its text: exactly what the database holds."""
        stored = list(RunEvent.objects.filter(run_id=run.pk).order_by("seq").values_list("seq", "type"))
        assert self.events() == stored
        assert self.page.locator("#text").text_content() == stored_text(run) != ""


@contextmanager
def configured(sites: Sites, site: Proc, page: Page, host: str, token: str) -> Iterator[App]:
    """The example served on `host`'s origin, its config.json saying to call `site` (through a
    proxy) with `token`."""
    proxy = CuttableProxy(upstream_port=int(site.port or 0)).start()
    try:
        sites.app.files["/config.json"] = json.dumps({"baseUrl": proxy.url, "token": token}).encode()
        yield App(page=page, proxy=proxy, origin=sites.app.origin(host), token=token)
    finally:
        proxy.stop()


@pytest.fixture
def app(sites: Sites, browser_page: Page, alice: User) -> Iterator[App]:
    """The example on the listed origin, calling the site that lists it with alice's token."""
    with configured(sites, sites.listed, browser_page, LISTED, token_for(alice)) as app:
        yield app


def test_the_text_streams_in_and_a_reload_mid_run_resumes_it_with_every_event_once(app: App) -> None:
    app.open()
    run = app.start(deltas=200, delay_ms=30)
    app.wait_events(10)
    expect(app.page.locator("#text")).not_to_have_text("")
    app.wait_shown("connection", "live")
    # StrictMode mounts the hook twice; it opened one stream.
    assert len(app.streams()) == 1

    assert status_of(run) == "running"
    app.page.reload()
    app.wait_shown("connection", "live")  # caught up, and live while the run goes on
    app.wait_shown("status", "completed")
    app.assert_shows_the_stored_log(run)  # which ends with run.completed: the reload stopped nothing
    # The reloaded page rebuilt its state from the whole log, on one stream again.
    after_reload = app.streams()[1:]
    assert len(after_reload) == 1 and "after_seq=0" in after_reload[0]
    # The token stayed in the page's memory: never in its address, its storage or a request's path.
    assert app.page.url == f"{app.origin}/?run={run.pk}"
    assert app.page.evaluate("() => [localStorage.length, sessionStorage.length, document.cookie]") == [0, 0, ""]
    assert not [seen.path for seen in app.proxy.requests if app.token in seen.path]
    save_screenshot(app.page, "react-example-completed")


def test_cut_again_and_again_anywhere_in_a_frame_the_page_holds_every_event_once(app: App) -> None:
    print(f"seed {SEED}")
    app.proxy.cut_streams_after(cut_budgets(SEED))
    # Runs one after another until enough cuts fell (a seed whose budgets are large cuts fewer
    # streams a run), each shown exactly as stored.
    for _ in range(5):
        app.open()
        run = app.start(deltas=120, delay_ms=10)
        app.wait_shown("status", "completed")
        app.assert_shows_the_stored_log(run)
        cuts, mid = app.proxy.cuts, sum(mid_frame(tail) for tail in app.proxy.cut_tails)
        if cuts >= 10 and mid >= 5:
            break
    print(f"{cuts} cuts ({mid} mid-frame), {len(app.streams())} stream requests")
    assert cuts >= 10 and mid >= 5, f"seed {SEED}"


def test_offline_and_back_it_resumes_from_the_last_event_it_held_with_every_event_once(app: App) -> None:
    app.open()
    run = app.start(deltas=200, delay_ms=30)
    app.wait_events(10)
    app.wait_shown("connection", "live")
    # Chromium keeps a stream open through set_offline (tests/support/proxies.py): the proxy drops
    # it, as a network gone would, and offline the page cannot connect again.
    app.page.context.set_offline(True)
    assert app.proxy.cut_streams() == 1
    app.wait_shown("connection", "reconnecting")
    held = app.events()
    wait_until(lambda: Run.objects.get(pk=run.pk).last_seq > held[-1][0] + 20, what="the run going on meanwhile")
    assert app.events() == held
    assert len(app.streams()) == 1  # nothing left the browser
    assert status_of(run) == "running"

    app.page.context.set_offline(False)
    app.wait_shown("status", "completed")
    app.assert_shows_the_stored_log(run)
    assert f"after_seq={held[-1][0]}" in app.streams()[1]


def test_stop_ends_the_run_with_one_run_cancelled(app: App) -> None:
    app.open()
    run = app.start(deltas=400, delay_ms=30)
    app.wait_events(10)
    app.page.click("#stop")
    app.wait_shown("status", "cancelled")
    expect(app.page.locator("#stop")).to_be_disabled()
    types = list(RunEvent.objects.filter(run_id=run.pk).order_by("seq").values_list("type", flat=True))
    assert types.count("run.cancelled") == 1 and types[-1] == "run.cancelled"
    app.wait_shown("connection", "ended")
    app.assert_shows_the_stored_log(run)
    assert Run.objects.get(pk=run.pk).end_code == "cancelled_by_user"


def test_closing_the_tab_leaves_the_run_running_to_its_end(app: App) -> None:
    app.open()
    run = app.start(deltas=80, delay_ms=50)
    app.wait_events(10)
    app.page.close()
    assert status_of(run) == "running"
    wait_until(lambda: status_of(run) == "completed", timeout=30, what="the run's end")
    assert not RunEvent.objects.filter(run_id=run.pk, type="run.cancelled").exists()


@pytest.mark.parametrize(("site", "host"), [("closed", LISTED), ("listed", "localhost")])
def test_without_the_cors_settings_or_from_an_origin_not_listed_the_page_shows_the_failure_and_nothing_is_made(
    sites: Sites, browser_page: Page, alice: User, site: str, host: str
) -> None:
    with configured(sites, getattr(sites, site), browser_page, host, token_for(alice)) as app:
        app.open()
        app.page.fill("#input", json.dumps({"deltas": 5}))
        app.page.click("#start")
        # The browser hides why (a refusal by CORS looks like a network failure): the client tried
        # again, then gave up, and the page says so.
        expect(app.page.locator("#error")).to_contain_text("ConnectionError", timeout=WAIT_MS)
        tried = [seen.method for seen in app.proxy.requests if seen.path == "/api/runs/"]
        assert tried and set(tried) == {"OPTIONS"}  # each refused at its preflight: no create was sent
        assert not Run.objects.filter(owner=alice).exists()

        # A run's page: it cannot be read, and its stream keeps trying, as for a network gone.
        run = queued_run(alice)
        app.open(str(run.pk))
        expect(app.page.locator("#error")).to_contain_text("ConnectionError", timeout=WAIT_MS)
        app.wait_shown("connection", "reconnecting")
        assert app.events() == []


def test_a_token_the_server_refuses_shows_the_stream_refused_with_its_reason(
    sites: Sites, browser_page: Page, alice: User
) -> None:
    with configured(sites, sites.listed, browser_page, LISTED, "not-a-key") as app:
        app.open()
        app.page.fill("#input", json.dumps({"deltas": 5}))
        app.page.click("#start")
        expect(app.page.locator("#error")).to_contain_text("AuthenticationError", timeout=WAIT_MS)
        assert not Run.objects.exists()

        run = queued_run(alice)
        app.open(str(run.pk))
        app.wait_shown("connection", "refused")
        expect(app.page.locator("#connection")).to_have_text("refused: not signed in (401)")
        save_screenshot(app.page, "react-example-refused")
        assert len(app.streams()) == 1  # refused once, never retried
