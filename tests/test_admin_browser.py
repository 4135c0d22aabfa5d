"""The staff console in a real browser: Debian's Chromium, a real uvicorn, the live SSE tail."""

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from runs import services
from runs.models import Run
from tests.factories import running_run
from tests.support.browser import admin_login, give_password, save_screenshot
from tests.support.procs import Procs

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

PASSWORD = "a-password-for-the-browser"


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
    run = running_run(alice)
    web = procs.uvicorn()
    page = browser_page
    give_password(staff, PASSWORD)
    admin_login(page, web.url, staff.username, PASSWORD)
    page.goto(f"{web.url}/admin/runs/run/{run.pk}/change/")
    expect(page.locator("#rl-tail-status")).to_have_text("live")
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
