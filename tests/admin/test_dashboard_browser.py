"""The staff dashboard in a real browser (Debian's Chromium, a real uvicorn and worker) on
`seed_demo`'s data and live runs: every chart shows what the database holds (computed here from
the rows, tests/support/dashboard.py), the figures refresh in place, and the page reads in the
admin's light and dark themes and at a phone's width. Screenshots: artifacts/dashboard-*.png."""

import contextlib
import io
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db.models import Q
from playwright.sync_api import Browser, Page, expect

from runs import services
from runs.exceptions import InvalidTransition
from runs.models import Run, RunAttempt
from runs.selectors.clock import db_now
from tests.factories import queued_run
from tests.support.browser import BROWSER_TESTS, DEFAULT_TIMEOUT_MS, admin_login, give_password, save_screenshot
from tests.support.dashboard import READ_PAGE, assert_same, expected, shown
from tests.support.procs import Procs, subprocess_env
from tests.support.waiting import wait_until

pytestmark = [*BROWSER_TESTS, pytest.mark.timeout(240)]

PASSWORD = "a-password-for-the-browser"
URL = "/admin/runs/dashboard/"


def _open(chromium: Browser, base_url: str, username: str, **context: Any) -> Page:
    page = chromium.new_context(**{"viewport": {"width": 1440, "height": 1000}, **context}).new_page()
    page.context.set_default_timeout(DEFAULT_TIMEOUT_MS)
    admin_login(page, base_url, username, PASSWORD)
    page.goto(base_url + URL)
    return page


def _check_against_the_database(page: Page) -> dict[str, Any]:
    """The page's figures equal those computed from every row at the moment the page was drawn."""
    read = page.evaluate(READ_PAGE)
    assert_same(shown(read), expected(datetime.fromisoformat(read["asOf"])))
    # Every chart drawn with a size and its bars, inside the window; read in one go, as a refresh
    # may replace the figures between two reads.
    boxes = page.evaluate(BOXES)
    assert len(boxes) == 6 + 8  # charts and tiles
    width = page.viewport_size["width"] if page.viewport_size else 0
    for box in boxes:
        assert box["width"] > 60 and box["height"] > 20 and box["bars"] != 0, box
        assert box["left"] >= 0 and box["right"] <= width, box
    return read


BOXES = """() => [...document.querySelectorAll('#rl-dashboard svg[data-chart], #rl-dashboard .rl-tile')].map(e => {
  const r = e.getBoundingClientRect();
  return {name: e.dataset.chart || e.dataset.tile, left: r.left, right: r.right, width: r.width, height: r.height,
          bars: e.tagName === 'svg' ? e.querySelectorAll('rect.rl-bar').length : null};
})"""


def _settled() -> bool:
    """Nothing left to run and every attempt released: cancel what is still queued or running."""
    for run in Run.objects.filter(status__in=("queued", "running")).select_related("owner"):
        with contextlib.suppress(InvalidTransition):  # it ended meanwhile
            services.run_cancel(run_id=run.pk, actor=run.owner, note="the test settles the system")
    unsettled = Q(outcome="") | Q(outcome__in=("cancelled", "stopped"), released_at__isnull=True)
    return not Run.objects.filter(status__in=("queued", "running")).exists() and not (
        RunAttempt.objects.filter(unsettled).exists()
    )


def _chart_text_colour(page: Page) -> str:
    return str(page.locator("svg[data-chart] text.rl-chart-label").first.evaluate("t => getComputedStyle(t).fill"))


def test_the_dashboard_draws_the_database_and_refreshes_in_place(
    chromium: Browser, procs: Procs, make_user: Callable[..., User], alice: User, settings: Any
) -> None:
    # The seed's "running" runs are held by no worker: a short lease lets them go stale here.
    settings.RUNLEDGER_LEASE_SECONDS = 2
    call_command("seed_demo", long_events=40, stdout=io.StringIO())
    staff = make_user("oncall", perms=("runs.view_run",), is_staff=True)
    give_password(staff, PASSWORD)
    web = procs.uvicorn(env=subprocess_env(RUNLEDGER_DASHBOARD_REFRESH_SECONDS="0.5"))

    page = _open(chromium, web.url, staff.username)
    read = _check_against_the_database(page)
    # The seed leaves runs in every live status and every end: no figure is a trivial 0.
    assert all(n > 0 for _, n in read["charts"]["runs-live"] + read["charts"]["runs-ended-day"]), read["charts"]
    save_screenshot(page, "dashboard-seeded-light")
    light_text = _chart_text_colour(page)

    dark = _open(chromium, web.url, staff.username, color_scheme="dark")
    _check_against_the_database(dark)
    dark_text = _chart_text_colour(dark)
    assert dark_text != light_text
    # Light text on the dark theme's background: every channel high.
    assert all(int(c) > 180 for c in dark_text.removeprefix("rgb(").rstrip(")").split(","))
    save_screenshot(dark, "dashboard-seeded-dark")

    phone = _open(chromium, web.url, staff.username, viewport={"width": 390, "height": 844}, is_mobile=True)
    _check_against_the_database(phone)  # within its 390 pixels too
    save_screenshot(phone, "dashboard-seeded-phone")

    # Live: a worker takes the queue (and the seed's stale runs, once swept); a long run of
    # Alice's shows under it, a cancel's release lands in the latency charts — all without a reload.
    page.evaluate("window.rlNotReloaded = true")
    procs.worker("dash-worker", concurrency=4)
    long = queued_run(alice, input={"deltas": 5000, "delay_ms": 20})
    wait_until(lambda: RunAttempt.objects.filter(run=long, outcome="").exists(), 30, "the worker holds Alice's run")
    expect(page.locator(f'#rl-workers tr[data-worker] a[data-run="{long.pk}"]')).to_have_count(1, timeout=20_000)
    save_screenshot(page, "dashboard-live-light")
    services.run_cancel(run_id=long.pk, actor=alice, note="enough")

    wait_until(_settled, 60, "every run ended or waiting and every attempt released")
    quiet = db_now()
    page.wait_for_function(
        "after => document.querySelector('#rl-dashboard .rl-figures').dataset.asOf > after",
        arg=quiet.isoformat(),
        timeout=20_000,
    )
    read = _check_against_the_database(page)
    assert page.evaluate("window.rlNotReloaded") is True
    assert read["workers"] == {} and read["stale"] == []
    assert read["charts"]["runs-live"] == [["queued", 0], ["running", 0], ["waiting", 1]]
    # The seed's cancel and stop, and Alice's cancel at least: released, so measured.
    assert sum(n for _, n in read["charts"]["cancel-latency-hour"]) >= 3
    assert read["percentiles"]["hour"]["p99"] is not None
    save_screenshot(page, "dashboard-settled-light")
