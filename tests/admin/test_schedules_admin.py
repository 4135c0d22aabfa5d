"""The console's schedules in process (the browser's view: tests/admin/test_schedules_browser.py):
who sees them, who may pause and resume them, and an action on a selection partly deleted meanwhile."""

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.test import Client

from runs.models import Schedule
from runs.services.schedules import schedule_create

pytestmark = pytest.mark.sqlite

LIST = "/admin/runs/schedule/"


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_only_staff_who_see_every_run_see_schedules(make_user: Callable[..., User], alice: User) -> None:
    schedule = schedule_create(owner=alice, agent="demo", input={}, every_seconds=3600)
    blind = signed_in(make_user("blind", perms=("runs.view_schedule",), is_staff=True))
    assert blind.get(LIST).status_code == 403
    assert blind.get(f"{LIST}{schedule.pk}/change/").status_code == 403
    assert "/admin/runs/schedule/" not in blind.get("/admin/").content.decode()
    seer = signed_in(make_user("seer", perms=("runs.view_run",), is_staff=True))
    assert seer.get(LIST).status_code == 200 and str(schedule.pk) in seer.get(LIST).content.decode()


def test_pause_and_resume_need_runs_change_run_and_a_deleted_schedule_is_said(
    make_user: Callable[..., User], alice: User
) -> None:
    schedule = schedule_create(owner=alice, agent="demo", input={}, every_seconds=3600)
    viewer = signed_in(make_user("viewer", perms=("runs.view_run",), is_staff=True))
    viewer.post(LIST, {"action": "pause", "_selected_action": [str(schedule.pk)]})
    assert not Schedule.objects.get().paused  # no such action for them

    staff = signed_in(make_user("ops", perms=("runs.view_run", "runs.change_run"), is_staff=True))
    done = staff.post(LIST, {"action": "pause", "_selected_action": [str(schedule.pk)]})
    assert done.status_code == 302 and Schedule.objects.get().paused
    assert [str(m) for m in get_messages(done.wsgi_request)] == ["1 schedule paused."]

    # Selected on a page drawn before it was deleted: the action takes the ones that exist.
    other = schedule_create(owner=alice, agent="demo", input={}, every_seconds=3600, overlap="allow_all")
    page = staff.get(LIST)  # both listed
    assert str(other.pk) in page.content.decode()
    Schedule.objects.filter(pk=schedule.pk).delete()
    resumed = staff.post(LIST, {"action": "resume", "_selected_action": [str(schedule.pk), str(other.pk)]})
    assert [str(m) for m in get_messages(resumed.wsgi_request)] == ["1 schedule resumed."]
