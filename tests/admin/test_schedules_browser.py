"""Schedules in the staff console, in a real browser (Debian's Chromium, a real uvicorn, and a real
worker for the dashboard): the list shows each schedule's timing, next due time and last run's
status as the database holds them; "pause" and "resume" act through the services; "its runs" is
the run list of its runs; the dashboard lists the late schedules, and drops one once a worker
fires it, without a reload. Screenshots: artifacts/schedules-*.png."""

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from runs.admin.display import moment
from runs.models import Run, Schedule
from runs.selectors.clock import db_now
from runs.selectors.schedules import schedules_late
from runs.services.schedules import schedule_create, schedule_trigger
from tests.factories import queued_run
from tests.support.browser import BROWSER_TESTS, admin_login, give_password, save_screenshot
from tests.support.procs import Procs, subprocess_env
from tests.support.waiting import wait_until

pytestmark = [*BROWSER_TESTS, pytest.mark.timeout(180)]

PASSWORD = "a-password-for-the-browser"
QUICK = {"deltas": 1, "delay_ms": 0}


def fresh(schedule: Schedule) -> Schedule:
    return Schedule.objects.select_related("last_run").get(pk=schedule.pk)


def row(page: Page, schedule: Schedule) -> Any:
    """The list's row of `schedule`: the one whose link opens it."""
    return page.locator("#result_list tbody tr").filter(has=page.locator(f'a[href$="/{schedule.pk}/change/"]'))


def signed_in(page: Page, procs: Procs, staff: User, **env: str) -> str:
    web = procs.uvicorn(env=subprocess_env(**env) if env else None)
    give_password(staff, PASSWORD)
    admin_login(page, web.url, staff.username, PASSWORD)
    return web.url


def test_staff_see_schedules_pause_and_resume_them_and_open_their_runs(
    browser_page: Page, procs: Procs, make_user: Callable[..., User], alice: User
) -> None:
    staff = make_user("oncall", perms=("runs.view_run", "runs.change_run", "runs.view_schedule"), is_staff=True)
    nightly = schedule_create(owner=alice, agent="demo", input=QUICK, cron="0 9 * * 1-5", timezone="Europe/Paris")
    hourly = schedule_create(owner=alice, agent="demo", input=QUICK, every_seconds=3600)
    fired = schedule_trigger(schedule_id=hourly.pk, actor=alice)
    assert fired is not None
    queued_run(alice)  # not the schedule's: "its runs" leaves it out
    page = browser_page
    url = signed_in(page, procs, staff)

    page.goto(f"{url}/admin/runs/schedule/")
    for schedule, timing in ((nightly, "cron 0 9 * * 1-5"), (hourly, "3600 s")):
        shown = row(page, schedule)
        expect(shown).to_contain_text(timing)
        expect(shown).to_contain_text(alice.username)
        expect(shown).to_contain_text(moment(fresh(schedule).next_due_at))
    expect(row(page, nightly)).to_contain_text("Europe/Paris")
    expect(row(page, nightly).locator("td.field-last_run_status")).to_have_text("—")
    expect(row(page, hourly).locator(".rl-status-queued")).to_have_text("queued")
    save_screenshot(page, "schedules-list")

    # Pause the nightly one: the action, its message, the row, the database.
    row(page, nightly).locator("input.action-select").check()
    page.select_option("select[name=action]", "pause")
    page.click("button[name=index]")
    expect(page.locator(".messagelist")).to_contain_text("1 schedule paused.")
    expect(row(page, nightly).locator("td.field-paused img")).to_have_attribute("alt", "True")
    expect(row(page, hourly).locator("td.field-paused img")).to_have_attribute("alt", "False")
    assert fresh(nightly).paused and not fresh(hourly).paused

    before = db_now()
    row(page, nightly).locator("input.action-select").check()
    page.select_option("select[name=action]", "resume")
    page.click("button[name=index]")
    expect(page.locator(".messagelist")).to_contain_text("1 schedule resumed.")
    resumed = fresh(nightly)
    assert not resumed.paused and resumed.next_due_at is not None and resumed.next_due_at > before
    expect(row(page, nightly)).to_contain_text(moment(resumed.next_due_at))

    # "its runs": the run list of the runs it created, and the run's page links back.
    row(page, hourly).locator("a.rl-schedule-runs").click()
    expect(page.locator("#result_list tbody tr")).to_have_count(1)
    expect(page.locator("#result_list")).to_contain_text(str(fired.pk)[:8])
    page.goto(f"{url}/admin/runs/run/{fired.pk}/change/")
    expect(page.locator(".field-schedule_link a")).to_have_text(str(hourly.pk))
    save_screenshot(page, "schedules-run-page")


def test_staff_who_may_only_view_get_no_pause_or_resume(
    browser_page: Page, procs: Procs, make_user: Callable[..., User], alice: User
) -> None:
    viewer = make_user("looker", perms=("runs.view_run",), is_staff=True)
    schedule = schedule_create(owner=alice, agent="demo", input=QUICK, every_seconds=3600)
    page = browser_page
    url = signed_in(page, procs, viewer)
    page.goto(f"{url}/admin/runs/schedule/")
    expect(row(page, schedule)).to_contain_text("3600 s")
    assert page.locator("select[name=action] option").all_text_contents() in ([], ["---------"])
    page.goto(f"{url}/admin/runs/schedule/{schedule.pk}/change/")
    expect(page.locator("#content")).to_contain_text("its runs")
    expect(page.locator("input[type=submit]")).to_have_count(0)  # view only


def test_the_dashboard_lists_a_late_schedule_until_a_worker_fires_it(
    browser_page: Page, procs: Procs, make_user: Callable[..., User], alice: User, settings: Any
) -> None:
    settings.RUNLEDGER_MIN_SCHEDULE_SECONDS = 1
    staff = make_user("oncall", perms=("runs.view_run",), is_staff=True)
    late = schedule_create(owner=alice, agent="demo", input=QUICK, every_seconds=1)
    on_time = schedule_create(owner=alice, agent="demo", input=QUICK, every_seconds=3600)
    # No worker runs: its first due time passes unfired, and it turns late.
    wait_until(lambda: [s.pk for s in schedules_late()] == [late.pk], 30, "the schedule is late")
    page = browser_page
    url = signed_in(page, procs, staff, RUNLEDGER_DASHBOARD_REFRESH_SECONDS="0.5")
    page.goto(f"{url}/admin/runs/dashboard/")

    listed = page.locator("#rl-late-schedules li[data-late-schedule]")
    expect(listed).to_have_count(1)
    item = page.locator(f'#rl-late-schedules li[data-late-schedule="{late.pk}"]')
    expect(item).to_contain_text("demo every 1 s")
    expect(item).to_contain_text(f"of {alice.username}")
    due = fresh(late).next_due_at
    assert due is not None
    expect(item).to_contain_text(f"due {due.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC")
    expect(item.locator("b.rl-stale")).to_contain_text("late ")
    assert page.locator(f'[data-late-schedule="{on_time.pk}"]').count() == 0
    item.locator("a").click()
    expect(page).to_have_url(f"{url}/admin/runs/schedule/{late.pk}/change/")
    expect(page.locator(".field-timing")).to_contain_text("1 s")  # the schedule's page, for who sees every run
    page.go_back()
    save_screenshot(page, "schedules-dashboard-late")

    # A worker comes: it fires the schedule, and the panel says "None." on its next refresh.
    page.evaluate("window.rlNotReloaded = true")
    procs.worker("schedules-worker", env=subprocess_env(RUNLEDGER_MIN_SCHEDULE_SECONDS="1"))
    wait_until(lambda: Run.objects.filter(schedule=late).exists(), 30, "the worker fires the late schedule")
    expect(page.locator("#rl-late-schedules li.rl-empty")).to_have_text("None.", timeout=20_000)
    assert page.evaluate("window.rlNotReloaded") is True
    assert fresh(late).next_due_at is not None and fresh(late).next_due_at > datetime.now(UTC) - timedelta(seconds=5)
    save_screenshot(page, "schedules-dashboard-fired")
