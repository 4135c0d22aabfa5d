"""The staff console in a real browser: Debian's Chromium, a real uvicorn, the live SSE tail."""

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from runs import services
from runs.models import Run
from tests.factories import running_run
from tests.support.browser import BROWSER_TESTS, admin_login, give_password, save_screenshot
from tests.support.procs import Procs
from tests.support.runs import status_of

pytestmark = BROWSER_TESTS

PASSWORD = "a-password-for-the-browser"


@pytest.fixture
def viewer(make_user: Callable[..., User]) -> User:
    """Staff on call who may view runs, and no more."""
    return make_user("oncall", perms=("runs.view_run",), is_staff=True)


def watch_live(page: Page, procs: Procs, staff: User, owner: User) -> tuple[Run, str, list[str]]:
    """A running run of `owner`'s, a new web process, and `staff` signed in on the run's page there,
    its live tail live: the run, the process's URL, and every URL the page requested."""
    run = running_run(owner)
    url = procs.uvicorn().url
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    give_password(staff, PASSWORD)
    admin_login(page, url, staff.username, PASSWORD)
    page.goto(f"{url}/admin/runs/run/{run.pk}/change/")
    expect(page.locator("#rl-tail-status")).to_have_text("live")
    return run, url, requests


def notes(run: Run, count: int) -> None:
    """`count` events of a type no page listens for, appended to the running `run`."""
    events: list[tuple[str, dict[str, Any]]] = [("custom.note", {"n": n}) for n in range(count)]
    services.run_events_append(run_id=run.pk, generation=run.generation, events=events)


def test_staff_watch_a_run_live_then_cancel_it_from_its_page(
    browser_page: Page, procs: Procs, make_user: Callable[..., User], alice: User
) -> None:
    staff = make_user("oncall", perms=("runs.view_run", "runs.change_run", "runs.cancel_run"), is_staff=True)
    run = running_run(alice)
    web = procs.uvicorn()
    page = browser_page

    give_password(staff, PASSWORD)
    admin_login(page, web.url, staff.username, PASSWORD)
    page.goto(f"{web.url}/admin/runs/run/")
    expect(page.locator("#result_list")).to_contain_text(str(run.pk)[:8])
    expect(page.locator("#result_list .rl-status-running")).to_have_count(1)
    save_screenshot(page, "admin-run-list")

    page.goto(f"{web.url}/admin/runs/run/{run.pk}/change/")
    expect(page.locator("[data-rl-run-status]")).to_have_text("running")
    expect(page.locator("#rl-tail-status")).to_have_text("live")

    # New events committed by "the worker" appear on the open page without a reload.
    services.run_events_append(
        run_id=run.pk,
        generation=run.generation,
        events=[
            ("output.delta", {"text": "hello from the worker"}),
            ("tool.started", {"call_id": "c1", "name": "slow"}),
        ],
    )
    rows = page.locator("#rl-events-body tr")
    expect(rows.last).to_have_attribute("data-seq", "4", timeout=10_000)
    expect(page.locator('#rl-events-body tr[data-seq="3"]')).to_contain_text("text: hello from the worker")
    expect(page.locator('#rl-events-body tr[data-seq="4"]')).to_contain_text("tool.started")
    save_screenshot(page, "admin-run-page-live")

    page.click("text=Cancel run…")
    expect(page.locator("#content-main")).to_contain_text("This run is live and will be cancelled")
    page.fill("#id_note", "runaway, cancelled from the console")
    page.click("input.rl-confirm")

    expect(page.locator(".messagelist")).to_contain_text(f"Run {str(run.pk)[:8]} cancelled.")
    expect(page.locator(".field-status_label .rl-badge")).to_have_text("cancelled")
    expect(page.locator("#rl-events-body tr").last).to_contain_text("run.cancelled")
    expect(page.locator("text=Cancel run…")).to_have_count(0)
    save_screenshot(page, "admin-run-page-cancelled")

    run.refresh_from_db()
    assert (run.status, run.end_code, run.ended_by) == ("cancelled", "cancelled_by_staff", "oncall")
    assert run.end_reason == "runaway, cancelled from the console"
    assert Run.objects.filter(pk=run.pk, status="cancelled").exists()


def test_a_run_ended_elsewhere_turns_terminal_on_the_open_page_with_every_event(
    browser_page: Page, procs: Procs, make_user: Callable[..., User], alice: User
) -> None:
    staff = make_user("oncall", perms=("runs.view_run", "runs.cancel_run", "runs.stop_run"), is_staff=True)
    page = browser_page
    run, _, _ = watch_live(page, procs, staff, alice)
    expect(page.locator("text=Stop run…")).to_have_count(1)

    # An event type the tail does not listen for shows up once the next one reveals the gap.
    services.run_events_append(run_id=run.pk, generation=run.generation, events=[("custom.note", {"n": 1})])
    services.run_stop(run_id=run.pk, actor=None, code="policy", reason="stopped by the platform")

    expect(page.locator("#rl-events-body tr").last).to_contain_text("run.stopped", timeout=10_000)
    expect(page.locator('#rl-events-body tr[data-seq="3"]')).to_contain_text("custom.note")
    assert page.locator("#rl-events-body tr").evaluate_all("rows => rows.map(r => r.dataset.seq)") == [
        "1",
        "2",
        "3",
        "4",
    ]
    expect(page.locator(".field-status_label .rl-badge")).to_have_text("stopped")
    expect(page.locator("#rl-tail-status")).to_have_text("ended: the run is stopped")
    expect(page.locator("text=Stop run…")).to_have_count(0)
    expect(page.locator("text=Cancel run…")).to_have_count(0)

    # The facts turn final without a reload: the title, the end, and the release once it comes.
    expect(page.locator("#content > h2")).to_contain_text("(stopped)")
    expect(page.locator(".field-end_code .readonly")).to_have_text("policy")
    expect(page.locator(".field-ended .readonly")).not_to_have_text("—")
    expect(page.locator(".field-stop_latency")).to_contain_text("not released yet")
    services.run_attempt_release(run_id=run.pk, generation=run.generation)
    page.wait_for_function("document.body.dataset.rlFacts === 'final'", timeout=20_000)
    expect(page.locator(".field-stop_latency")).to_contain_text(" s")
    expect(page.locator("#rl-events-body tr")).to_have_count(4)  # the tail stayed as it was


def test_the_tail_shows_every_event_of_any_type_as_it_comes_with_no_page_read(
    browser_page: Page, procs: Procs, viewer: User, alice: User
) -> None:
    page = browser_page
    run, base, requests = watch_live(page, procs, viewer, alice)

    # 250 events of a type the run's agent never declared (more than two pages of events), one
    # output delta, then the end.
    notes(run, 250)
    services.run_events_append(run_id=run.pk, generation=run.generation, events=[("output.delta", {"text": "x"})])
    services.run_stop(run_id=run.pk, actor=None, code="policy", reason="enough")

    expect(page.locator("#rl-tail-status")).to_have_text("ended: the run is stopped", timeout=20_000)
    run.refresh_from_db()
    seqs = page.locator("#rl-events-body tr").evaluate_all("rows => rows.map(r => Number(r.dataset.seq))")
    assert seqs == list(range(1, run.last_seq + 1))
    # All of them came on the one stream, none from an events page.
    assert [url for url in requests if "/events/" in url] == []
    assert len([url for url in requests if url.startswith(f"{base}/api/runs/{run.pk}/stream/")]) == 1


def test_the_tail_of_a_run_its_reader_may_no_longer_see_says_why_and_stops(
    browser_page: Page, procs: Procs, viewer: User, alice: User
) -> None:
    page = browser_page
    run, base, requests = watch_live(page, procs, viewer, alice)

    # Access taken away: the server's re-check ends the open stream, and its reconnect is a 404.
    viewer.user_permissions.clear()
    expect(page.locator("#rl-tail-status")).to_have_text("refused: no such run (404)", timeout=20_000)
    expect(page.locator("#rl-tail-status")).to_have_class("rl-tail-trouble")
    streams = [url for url in requests if url.startswith(f"{base}/api/runs/{run.pk}/stream/")]
    assert len(streams) == 2  # the stream, and the reconnect refused
    # Many retry intervals later (its backoff starts at 200 ms), still no other: it stopped.
    page.wait_for_timeout(1500)
    assert len([url for url in requests if url.startswith(f"{base}/api/runs/{run.pk}/stream/")]) == 2
    assert status_of(run) == "running"
