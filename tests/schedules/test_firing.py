"""The fire (runs.services.firing, docs/design/schedules.md#firing) in process: catch-up, every
overlap policy, `schedule.skipped` / `schedule.failed` through the webhook outbox once per streak, a
refused create, the end, a due time whose run exists already, a cron across daylight-saving
changes (explicit instants), the metrics, and the late schedules the dashboard lists."""

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F
from django.test import Client
from django.utils import timezone

from runs import services
from runs.events import FireOutcome as Outcome
from runs.models import Run, RunEvent, Schedule, WebhookDelivery, WebhookNotification
from runs.selectors.schedules import schedules_late, schedules_next_due_in
from runs.services.firing import Fired, fire_buffered, fire_locked, fire_next
from runs.services.schedules import schedule_create, schedule_trigger
from tests.support.metrics import parse, value

pytestmark = pytest.mark.sqlite

URL = "https://hooks.example.test/in"
MINUTE = timedelta(seconds=60)


@pytest.fixture(autouse=True)
def _short_schedules(settings: Any) -> None:
    settings.RUNLEDGER_MIN_SCHEDULE_SECONDS = 1


def every_minute(owner: User, **given: Any) -> Schedule:
    return schedule_create(owner=owner, agent="demo", input={"deltas": 1}, every_seconds=60, **given)


def rewind(schedule: Schedule, by: timedelta) -> Schedule:
    """As if the schedule had been created `by` earlier and no worker had fired it since."""
    Schedule.objects.filter(pk=schedule.pk).update(
        anchor=F("anchor") - by, next_due_at=F("next_due_at") - by, created_at=F("created_at") - by
    )
    return Schedule.objects.get(pk=schedule.pk)


def due_again(schedule: Schedule) -> Schedule:
    """Its next due time, a minute ahead, moved to just now."""
    return rewind(Schedule.objects.get(pk=schedule.pk), MINUTE + timedelta(milliseconds=100))


def fire_all() -> list[Fired]:
    fired = []
    while (one := fire_next()) is not None:
        fired.append(one)
    return fired


def test_after_downtime_only_the_latest_missed_due_time_fires_by_default(alice: User) -> None:
    schedule = rewind(every_minute(alice), 10 * MINUTE + timedelta(seconds=30))  # ten due times missed
    [fired] = fire_all()
    assert fired.outcome == Outcome.CREATED and fired.run is not None
    assert fired.due_at == schedule.anchor + 10 * MINUTE  # the latest, on its grid
    after = Schedule.objects.get(pk=schedule.pk)
    assert after.next_due_at == fired.due_at + MINUTE and after.last_run_id == fired.run.pk
    assert Run.objects.filter(schedule=schedule).count() == 1


def test_a_catchup_window_fires_the_missed_due_times_within_it_in_order(alice: User) -> None:
    schedule = every_minute(alice, overlap="allow_all", catchup_window_seconds=300)
    schedule = rewind(schedule, 10 * MINUTE + timedelta(seconds=30))
    fired = fire_all()
    assert [f.due_at for f in fired] == [schedule.anchor + m * MINUTE for m in (6, 7, 8, 9, 10)]
    created = Run.objects.filter(schedule=schedule).order_by("created_at")
    assert [run.schedule_due_at for run in created] == [f.due_at for f in fired]


def test_skip_creates_nothing_while_the_last_run_is_live_and_tells_once_per_streak(alice: User) -> None:
    services.webhook_create(owner=alice, url=URL, events=["schedule.skipped", "schedule.failed"])
    schedule = due_again(every_minute(alice, metadata={"team": "a"}))
    [first] = fire_all()
    assert first.outcome == Outcome.CREATED
    skips = []
    for _ in range(3):
        due_again(schedule)
        skips += fire_all()
    assert [f.outcome for f in skips] == [Outcome.SKIPPED] * 3
    assert Run.objects.filter(schedule=schedule).count() == 1
    [told] = WebhookDelivery.objects.filter(event_type="schedule.skipped")
    body = json.loads(WebhookNotification.objects.get(pk=told.notification_id).body)
    assert body["type"] == "schedule.skipped"
    assert body["data"]["schedule"]["id"] == str(schedule.pk)
    assert body["data"]["schedule"]["metadata"] == {"team": "a"} and body["data"]["schedule"]["input"] is None
    assert body["data"]["due_at"].replace("Z", "+00:00") == skips[0].due_at.isoformat()
    assert told.run_id == schedule.pk
    # Its run ends: the next due time creates one, and a new streak of skips is told again.
    services.run_cancel(run_id=first.run.pk, actor=alice)  # type: ignore[union-attr]
    due_again(schedule)
    assert [f.outcome for f in fire_all()] == [Outcome.CREATED]
    assert Schedule.objects.get(pk=schedule.pk).told == ""
    due_again(schedule)
    assert [f.outcome for f in fire_all()] == [Outcome.SKIPPED]
    assert WebhookDelivery.objects.filter(event_type="schedule.skipped").count() == 2


def test_buffer_one_keeps_one_due_time_and_creates_its_run_when_the_live_one_ends(alice: User) -> None:
    schedule = due_again(every_minute(alice, overlap="buffer_one"))
    [first] = fire_all()
    due_again(schedule)
    [buffered] = fire_all()
    due_again(schedule)
    [skipped] = fire_all()
    assert (buffered.outcome, skipped.outcome) == (Outcome.BUFFERED, Outcome.SKIPPED)
    assert Schedule.objects.get(pk=schedule.pk).buffered_due_at == buffered.due_at
    assert fire_buffered() is None  # the live run has not ended
    services.run_cancel(run_id=first.run.pk, actor=alice)  # type: ignore[union-attr]
    later = fire_buffered()
    assert later is not None and later.outcome == Outcome.CREATED and later.run is not None
    assert later.run.schedule_due_at == buffered.due_at
    after = Schedule.objects.get(pk=schedule.pk)
    assert after.buffered_due_at is None and after.last_run_id == later.run.pk
    assert fire_buffered() is None
    assert Run.objects.filter(schedule=schedule).count() == 2


def test_cancel_other_cancels_the_live_run_through_the_normal_cancel(alice: User) -> None:
    schedule = due_again(every_minute(alice, overlap="cancel_other"))
    [first] = fire_all()
    due_again(schedule)
    [second] = fire_all()
    assert second.outcome == Outcome.CREATED and second.run is not None
    cancelled = Run.objects.get(pk=first.run.pk)  # type: ignore[union-attr]
    assert (cancelled.status, cancelled.end_code, cancelled.ended_by) == ("cancelled", "schedule_overlap", "system")
    assert RunEvent.objects.filter(run=cancelled, type="run.cancelled").count() == 1
    assert Run.objects.get(pk=second.run.pk).status == "queued"


def test_allow_all_creates_each_run_beside_the_live_ones(alice: User) -> None:
    schedule = every_minute(alice, overlap="allow_all")
    for _ in range(3):
        due_again(schedule)
        assert [f.outcome for f in fire_all()] == [Outcome.CREATED]
    assert Run.objects.filter(schedule=schedule, status="queued").count() == 3


def test_a_create_the_caps_refuse_is_told_and_its_due_time_still_passes(settings: Any, alice: User) -> None:
    settings.RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER = 1
    services.webhook_create(owner=alice, url=URL, events=["schedule.failed"])
    services.run_create(owner=alice, agent="demo", input={})
    schedule = due_again(every_minute(alice))
    [failed] = fire_all()
    assert failed.outcome == Outcome.FAILED and failed.run is None
    after = Schedule.objects.get(pk=schedule.pk)
    assert after.next_due_at == failed.due_at + MINUTE and after.told == "schedule.failed"
    [told] = WebhookNotification.objects.filter(event_type="schedule.failed")
    assert "RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER" in json.loads(told.body)["data"]["reason"]
    assert not Run.objects.filter(schedule=schedule).exists()


def test_no_due_time_fires_past_the_end_nor_while_paused(alice: User) -> None:
    schedule = due_again(every_minute(alice, end_at=timezone.now() + timedelta(hours=1)))
    Schedule.objects.filter(pk=schedule.pk).update(end_at=F("next_due_at") + timedelta(seconds=30))
    [fired] = fire_all()
    assert fired.outcome == Outcome.CREATED
    assert Schedule.objects.get(pk=schedule.pk).next_due_at is None
    assert fire_all() == []
    paused = due_again(every_minute(alice))
    services.schedule_pause(schedule_id=paused.pk, actor=alice)
    assert fire_all() == []


def test_a_due_time_that_has_its_run_already_moves_on_without_another(alice: User) -> None:
    schedule = due_again(every_minute(alice))
    triggered = schedule_trigger(schedule_id=schedule.pk, actor=alice)
    assert triggered is not None
    # As if the trigger had come at the very instant of the due time.
    Run.objects.filter(pk=triggered.pk).update(schedule_due_at=schedule.next_due_at)
    Schedule.objects.filter(pk=schedule.pk).update(last_run=None)
    fired = fire_next()
    assert fired is not None and (fired.outcome, fired.run) == (Outcome.EXISTS, None)
    assert Schedule.objects.get(pk=schedule.pk).next_due_at == schedule.next_due_at + MINUTE  # type: ignore[operator]
    assert Run.objects.filter(schedule=schedule).count() == 1


def test_the_metrics_count_fires_by_outcome_and_their_lateness(
    alice: User, make_user: Callable[..., User], client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    client.force_login(make_user("ops", perms=("runs.view_run",)))
    metrics = client
    before = parse(metrics.get("/metrics/").content.decode())
    schedule = rewind(every_minute(alice), 3 * MINUTE + timedelta(seconds=30))
    with django_capture_on_commit_callbacks(execute=True):
        fire_all()
        due_again(schedule)
        fire_all()
    after = parse(metrics.get("/metrics/").content.decode())

    def grew(name: str, **labels: str) -> float:
        try:
            was = value(before, name, **labels)
        except KeyError:
            was = 0
        return value(after, name, **labels) - was

    assert grew("runledger_schedule_fires_total", outcome="created") == 1
    assert grew("runledger_schedule_fires_total", outcome="skipped") == 1
    assert grew("runledger_schedule_fires_total", outcome="missed") == 2
    assert grew("runledger_schedule_lateness_seconds_count") == 2
    # Each 30 s late: the latest of three missed, then one made due 30 s ago.
    assert 60 <= grew("runledger_schedule_lateness_seconds_sum") < 62


def test_a_cron_in_paris_fires_once_a_day_across_both_daylight_saving_changes(alice: User) -> None:
    """The fire driven with explicit instants (its clock is the caller's): 02:30 does not exist on
    2027-03-28 and happens twice on 2027-10-31."""
    schedule = schedule_create(owner=alice, agent="demo", input={}, cron="30 2 * * *", timezone="Europe/Paris")
    # Each: the day's due time, when it is fired, and the next day's due time.
    days = [
        (datetime(2027, 3, 27, 1, 30, tzinfo=UTC), datetime(2027, 3, 28, 1, 0, tzinfo=UTC)),  # → 03:00 CEST
        (datetime(2027, 3, 28, 1, 0, tzinfo=UTC), datetime(2027, 3, 29, 0, 30, tzinfo=UTC)),
        (datetime(2027, 10, 30, 0, 30, tzinfo=UTC), datetime(2027, 10, 31, 0, 30, tzinfo=UTC)),  # the first 02:30
        (datetime(2027, 10, 31, 0, 30, tzinfo=UTC), datetime(2027, 11, 1, 1, 30, tzinfo=UTC)),  # not the second
    ]
    for due, following in days:
        Schedule.objects.filter(pk=schedule.pk).update(next_due_at=due, last_run=None)
        with transaction.atomic():
            locked = Schedule.objects.select_related("owner", "last_run").get(pk=schedule.pk)
            fired = fire_locked(locked, now=due + timedelta(milliseconds=200))
            locked.save()
        assert (fired.outcome, fired.due_at) == (Outcome.CREATED, due)
        assert Schedule.objects.get(pk=schedule.pk).next_due_at == following
    assert sorted(Run.objects.filter(schedule=schedule).values_list("schedule_due_at", flat=True)) == [
        due for due, _ in days
    ]


def test_the_late_schedules_are_the_active_ones_due_more_than_five_seconds_ago(alice: User) -> None:
    late = rewind(every_minute(alice), MINUTE + timedelta(seconds=30))
    rewind(every_minute(alice), MINUTE + timedelta(seconds=2))  # due, not late yet
    paused = rewind(every_minute(alice), MINUTE + timedelta(seconds=40))
    services.schedule_pause(schedule_id=paused.pk, actor=alice)
    every_minute(alice)
    assert schedules_late() == [late]
    ahead = schedules_next_due_in()
    assert ahead is not None and -31 < ahead < -29  # the soonest active one, by the database's clock
    fire_all()
    assert schedules_late() == []
