"""The schedules' commands at the service level (runs.services.schedules, docs/design/schedules.md#commands):
validation naming the field, the caps and permissions, owner scoping, pause, resume, trigger and
backfill with `max`, and the run JSON's `schedule` with the run list's `?schedule=` filter."""

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from runs import services
from runs.exceptions import NotFound, TooManyRequests, ValidationFailed
from runs.models import Run, Schedule
from runs.selectors.schedules import schedule_get, schedule_json, schedule_list
from tests.support.api import api_for

pytestmark = pytest.mark.sqlite


@pytest.fixture(autouse=True)
def _short_schedules(settings: Any) -> None:
    settings.RUNLEDGER_MIN_SCHEDULE_SECONDS = 1


def every(owner: User, seconds: int = 60, **given: Any) -> Schedule:
    return services.schedule_create(owner=owner, agent="demo", input={"deltas": 1}, every_seconds=seconds, **given)


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"agent": "nope", "every_seconds": 60}, "agent"),
        ({"input": [], "every_seconds": 60}, "input"),
        ({"input": {"deltas": "many"}, "every_seconds": 60}, "input"),
        ({"metadata": {"": "x"}, "every_seconds": 60}, "metadata"),
        ({"priority": 5000, "every_seconds": 60}, "priority"),
        ({"priority": True, "every_seconds": 60}, "priority"),
        ({}, "cron"),
        ({"cron": "*/5 * * * *", "every_seconds": 60}, "every_seconds"),
        ({"cron": "*/5 * * *"}, "cron"),
        ({"cron": 5}, "cron"),
        ({"every_seconds": 0}, "every_seconds"),
        ({"every_seconds": 1.5}, "every_seconds"),
        ({"every_seconds": 60, "timezone": "Mars/Olympus"}, "timezone"),
        ({"every_seconds": 60, "overlap": "queue"}, "overlap"),
        ({"every_seconds": 60, "catchup_window_seconds": -1}, "catchup_window_seconds"),
        ({"every_seconds": 60, "catchup_window_seconds": 86_401}, "catchup_window_seconds"),
        ({"every_seconds": 60, "start_at": "yesterday"}, "start_at"),
        ({"every_seconds": 60, "start_at": "2026-01-01T00:00:00"}, "start_at"),
        (
            {"every_seconds": 60, "start_at": "2030-01-02T00:00:00Z", "end_at": "2030-01-01T00:00:00Z"},
            "end_at",
        ),
    ],
)
def test_a_bad_field_is_a_400_naming_it_and_nothing_is_stored(alice: User, given: dict[str, Any], field: str) -> None:
    body = {"owner": alice, "agent": "demo", "input": {}} | given
    with pytest.raises(ValidationFailed) as refused:
        services.schedule_create(**body)
    assert field in refused.value.detail
    assert not Schedule.objects.exists()


def test_the_minimum_interval_holds_unless_the_owner_may_schedule_often(
    settings: Any, make_user: Callable[..., User]
) -> None:
    settings.RUNLEDGER_MIN_SCHEDULE_SECONDS = 60
    alice = make_user("alice")
    with pytest.raises(ValidationFailed) as refused:
        every(alice, 30)
    assert "RUNLEDGER_MIN_SCHEDULE_SECONDS" in refused.value.detail["every_seconds"][0]
    assert every(alice, 60).every_seconds == 60
    assert services.schedule_create(owner=alice, agent="demo", input={}, cron="* * * * *").cron == "* * * * *"
    settings.RUNLEDGER_MIN_SCHEDULE_SECONDS = 3600
    with pytest.raises(ValidationFailed) as refused:
        services.schedule_create(owner=alice, agent="demo", input={}, cron="0,30 * * * *", timezone="Europe/Paris")
    assert "cron" in refused.value.detail
    assert services.schedule_create(owner=alice, agent="demo", input={}, cron="@hourly").cron == "@hourly"
    often = make_user("often", perms=("runs.schedule_often",))
    assert every(often, 5).every_seconds == 5


def test_a_priority_above_100_needs_the_permission_a_runs_does(make_user: Callable[..., User]) -> None:
    alice = make_user("alice")
    with pytest.raises(ValidationFailed) as refused:
        every(alice, priority=500)
    assert "runs.prioritize_run" in refused.value.detail["priority"][0]
    boss = make_user("boss", perms=("runs.prioritize_run",))
    assert every(boss, priority=500).priority == 500


def test_the_schedules_cap_is_a_429_after_the_input_is_checked(settings: Any, alice: User, bob: User) -> None:
    settings.RUNLEDGER_MAX_SCHEDULES_PER_USER = 2
    every(alice)
    every(alice)
    with pytest.raises(ValidationFailed):
        services.schedule_create(
            owner=alice, agent="nope", input={}, every_seconds=60
        )  # the input first, as every cap (docs/design/fair-use.md#refusals)
    with pytest.raises(TooManyRequests) as refused:
        every(alice)
    assert refused.value.detail == {"schedules": 2, "limit": 2}
    assert every(bob).owner_id == bob.pk  # one user's cap is theirs alone
    services.schedule_delete(schedule_id=Schedule.objects.filter(owner=alice).first().pk, actor=alice)  # type: ignore[union-attr]
    assert every(alice).owner_id == alice.pk


def test_an_interval_first_falls_due_one_interval_after_its_creation_or_at_its_start(alice: User) -> None:
    before = timezone.now()
    schedule = every(alice, 60)
    assert schedule.next_due_at == schedule.anchor + timedelta(seconds=60)
    assert before <= schedule.anchor <= timezone.now()
    start = timezone.now() + timedelta(hours=2)
    later = every(alice, 60, start_at=start)
    assert later.next_due_at == start and later.anchor == start
    ended = every(alice, 60, start_at=start, end_at=start + timedelta(seconds=30))
    assert ended.next_due_at == start
    gone = every(alice, 60, start_at=timezone.now() - timedelta(hours=2), end_at=timezone.now() - timedelta(hours=1))
    assert gone.next_due_at is None


def test_another_users_schedule_is_not_found_for_every_command(alice: User, bob: User) -> None:
    schedule = every(alice)
    now = timezone.now()
    commands: list[Callable[[], object]] = [
        lambda: schedule_get(user=bob, schedule_id=schedule.pk),
        lambda: services.schedule_update(schedule_id=schedule.pk, actor=bob, priority=1),
        lambda: services.schedule_pause(schedule_id=schedule.pk, actor=bob),
        lambda: services.schedule_resume(schedule_id=schedule.pk, actor=bob),
        lambda: services.schedule_trigger(schedule_id=schedule.pk, actor=bob),
        lambda: services.schedule_backfill(
            schedule_id=schedule.pk, actor=bob, start=now - timedelta(hours=1), end=now, max=5
        ),
        lambda: services.schedule_delete(schedule_id=schedule.pk, actor=bob),
        lambda: schedule_get(user=alice, schedule_id="not-a-uuid"),
    ]
    for command in commands:
        with pytest.raises(NotFound):
            command()
    assert list(schedule_list(user=bob)) == []
    after = Schedule.objects.get(pk=schedule.pk)
    assert (after.paused, after.priority, Run.objects.count()) == (False, 0, 0)


def test_staff_who_may_change_any_run_may_act_on_any_schedule(alice: User, make_user: Callable[..., User]) -> None:
    schedule = every(alice)
    staff = make_user("staff", perms=("runs.change_run",))
    assert schedule_get(user=staff, schedule_id=schedule.pk) == schedule
    assert services.schedule_pause(schedule_id=schedule.pk, actor=staff).paused
    assert list(schedule_list(user=staff)) == [schedule]


def test_pause_keeps_it_quiet_and_resume_fires_from_now_without_the_missed_ones(alice: User) -> None:
    schedule = every(alice, 60)
    paused = services.schedule_pause(schedule_id=schedule.pk, actor=alice)
    assert paused.paused and schedule_json(paused)["paused"] is True
    # Paused for an hour: resumed, its next due time is the first after now, on its grid.
    hour = timedelta(hours=1)
    Schedule.objects.filter(pk=schedule.pk).update(
        anchor=schedule.anchor - hour,
        next_due_at=schedule.next_due_at - hour,  # type: ignore[operator]
    )
    resumed = services.schedule_resume(schedule_id=schedule.pk, actor=alice)
    now = timezone.now()
    assert not resumed.paused
    assert resumed.next_due_at is not None and now < resumed.next_due_at <= now + timedelta(seconds=60)
    assert (resumed.next_due_at - resumed.anchor).total_seconds() % 60 == 0
    assert services.schedule_resume(schedule_id=schedule.pk, actor=alice).next_due_at == resumed.next_due_at


def test_an_update_validates_the_whole_and_moves_the_due_times_it_changes(alice: User) -> None:
    schedule = every(alice, 60)
    with pytest.raises(ValidationFailed) as refused:
        services.schedule_update(schedule_id=schedule.pk, actor=alice, timezone="Nowhere")
    assert "timezone" in refused.value.detail
    with pytest.raises(ValidationFailed) as refused:
        services.schedule_update(schedule_id=schedule.pk, actor=alice, owner=5)
    assert "owner" in refused.value.detail
    changed = services.schedule_update(schedule_id=schedule.pk, actor=alice, cron="0 9 * * *", timezone="Europe/Paris")
    assert (changed.cron, changed.every_seconds) == ("0 9 * * *", None)
    assert changed.next_due_at is not None and changed.next_due_at.astimezone(timezone.get_current_timezone())
    assert changed.next_due_at > timezone.now()
    back = services.schedule_update(schedule_id=schedule.pk, actor=alice, every_seconds=120)
    assert (back.cron, back.every_seconds) == ("", 120)
    assert back.next_due_at == back.anchor + timedelta(seconds=120)
    stored = Schedule.objects.get(pk=schedule.pk)
    assert (stored.cron, stored.every_seconds, stored.timezone) == ("", 120, "Europe/Paris")


def test_trigger_fires_now_under_the_overlap_policy_and_leaves_the_next_due_time(alice: User) -> None:
    schedule = every(alice, 60)
    run = services.schedule_trigger(schedule_id=schedule.pk, actor=alice)
    assert run is not None and run.schedule_id == schedule.pk and run.schedule_due_at is not None
    assert Schedule.objects.get(pk=schedule.pk).next_due_at == schedule.next_due_at
    # Its run is still queued: `skip` creates nothing.
    assert services.schedule_trigger(schedule_id=schedule.pk, actor=alice) is None
    services.schedule_update(schedule_id=schedule.pk, actor=alice, overlap="allow_all")
    second = services.schedule_trigger(schedule_id=schedule.pk, actor=alice)
    assert second is not None and Run.objects.filter(schedule=schedule, status="queued").count() == 2
    services.schedule_update(schedule_id=schedule.pk, actor=alice, overlap="cancel_other")
    third = services.schedule_trigger(schedule_id=schedule.pk, actor=alice)
    assert third is not None
    cancelled = Run.objects.get(pk=second.pk)
    assert (cancelled.status, cancelled.end_code) == ("cancelled", "schedule_overlap")
    services.schedule_update(schedule_id=schedule.pk, actor=alice, overlap="buffer_one")
    assert services.schedule_trigger(schedule_id=schedule.pk, actor=alice) is None
    assert Schedule.objects.get(pk=schedule.pk).buffered_due_at is not None


def test_trigger_refused_by_the_owners_caps_is_raised_to_its_caller(settings: Any, alice: User) -> None:
    settings.RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER = 1
    schedule = every(alice, 60, overlap="allow_all")
    assert services.schedule_trigger(schedule_id=schedule.pk, actor=alice) is not None
    with pytest.raises(TooManyRequests):
        services.schedule_trigger(schedule_id=schedule.pk, actor=alice)


def test_backfill_creates_the_missing_due_times_oldest_first_up_to_max_and_never_twice(alice: User) -> None:
    schedule = every(alice, 60)
    start = schedule.anchor - timedelta(minutes=10)
    runs = services.schedule_backfill(schedule_id=schedule.pk, actor=alice, start=start, end=schedule.anchor, max=4)
    dues = [run.schedule_due_at for run in runs]
    assert dues == [start + timedelta(minutes=m) for m in range(4)]
    # Retried with a larger max: the four are not created again; the seven others are.
    more = services.schedule_backfill(schedule_id=schedule.pk, actor=alice, start=start, end=schedule.anchor, max=100)
    assert [run.schedule_due_at for run in more] == [start + timedelta(minutes=m) for m in range(4, 11)]
    assert Run.objects.filter(schedule=schedule).count() == 11
    for bad, field in (
        ({"max": 0}, "max"),
        ({"max": 1001}, "max"),
        ({"end": timezone.now() + timedelta(hours=1)}, "to"),
    ):
        body: dict[str, Any] = {"start": start, "end": schedule.anchor, "max": 5} | bad
        with pytest.raises(ValidationFailed) as refused:
            services.schedule_backfill(schedule_id=schedule.pk, actor=alice, **body)
        assert field in refused.value.detail


def test_a_deleted_schedules_runs_stay(alice: User) -> None:
    schedule = every(alice, 60)
    run = services.schedule_trigger(schedule_id=schedule.pk, actor=alice)
    assert run is not None
    services.schedule_delete(schedule_id=schedule.pk, actor=alice)
    assert not Schedule.objects.exists()
    assert Run.objects.get(pk=run.pk).schedule_id is None


def test_a_scheduled_runs_json_names_its_schedule_and_the_list_filters_by_it(alice: User) -> None:
    schedule = every(alice, 60, overlap="allow_all")
    fired = [services.schedule_trigger(schedule_id=schedule.pk, actor=alice) for _ in range(2)]
    other = services.run_create(owner=alice, agent="demo", input={})
    api = api_for(alice)
    body = api.get(f"/api/runs/{fired[0].pk}/").json()  # type: ignore[union-attr]
    due = fired[0].schedule_due_at  # type: ignore[union-attr]
    assert body["schedule"]["id"] == str(schedule.pk)
    assert body["schedule"]["due_at"].replace("Z", "+00:00") == due.isoformat()  # type: ignore[union-attr]
    assert api.get(f"/api/runs/{other.pk}/").json()["schedule"] is None
    listed = api.get(f"/api/runs/?schedule={schedule.pk}").json()["results"]
    assert sorted(item["id"] for item in listed) == sorted(str(run.pk) for run in fired)  # type: ignore[union-attr]
    assert all(item["schedule"]["id"] == str(schedule.pk) for item in listed)
    assert api.get("/api/runs/?schedule=nope").status_code == 400
