"""`/api/schedules/` (docs/design/schedules.md#commands, docs/design/api.md#urls): each verb's answer, the
400 naming the field, another user's schedule a 404 on every verb, the per-user cap, the priority
permission, and the fire by hand (trigger, backfill) — in process, through DRF's test client, on a
real database. The same surface over real HTTP: tests/api/test_api_live.py (Schemathesis) and the
client's tests (tests/client/)."""

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs.models import Run, Schedule
from runs.selectors.clock import db_now
from tests.support.api import RUN_KEYS, api_for, assert_error
from tests.support.docs import listed_names

pytestmark = pytest.mark.sqlite

# The keys of a schedule's JSON as its design page lists them: the answer is held to the page, not
# to the code that makes it.
SCHEDULE_KEYS = listed_names("design/schedules.md", "json")
PARIS = ZoneInfo("Europe/Paris")
HOURLY = {"agent": "demo", "input": {"deltas": 1, "delay_ms": 0}, "every_seconds": 3600}


def create(user: User, **body: Any) -> dict[str, Any]:
    response = api_for(user).post("/api/schedules/", {**HOURLY, **body}, format="json")
    assert response.status_code == 201, response.content
    made: dict[str, Any] = response.json()
    return made


def when(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def test_create_read_list_change_and_delete(alice: User) -> None:
    before = db_now()
    made = create(alice, cron="0 9 * * 1-5", every_seconds=None, timezone="Europe/Paris", metadata={"team": "a"})
    assert set(made) == SCHEDULE_KEYS
    assert (made["cron"], made["every_seconds"], made["timezone"], made["overlap"]) == (
        "0 9 * * 1-5",
        None,
        "Europe/Paris",
        "skip",
    )
    assert made["paused"] is False and made["last_run"] is None and made["metadata"] == {"team": "a"}
    due = when(made["next_due_at"])
    assert due is not None and due > before
    assert (due.astimezone(PARIS).hour, due.astimezone(PARIS).minute, due.weekday() < 5) == (9, 0, True)

    api = api_for(alice)
    assert api.get(f"/api/schedules/{made['id']}/").json() == made
    second = create(alice)
    third = create(alice, overlap="allow_all")
    # Newest first, one a page, each once by following `next`.
    seen, url = [], "/api/schedules/?page_size=1"
    while url:
        page = api.get(url).json()
        seen += [s["id"] for s in page["results"]]
        url = page["next"]
    assert seen == [third["id"], second["id"], made["id"]]

    changed = api.patch(f"/api/schedules/{made['id']}/", {"every_seconds": 7200, "priority": 5}, format="json")
    assert changed.status_code == 200, changed.content
    body = changed.json()
    assert (body["cron"], body["every_seconds"], body["priority"]) == ("", 7200, 5)  # an interval clears the cron
    assert when(body["updated_at"]) > when(made["updated_at"])  # type: ignore[operator]
    assert api.delete(f"/api/schedules/{made['id']}/").status_code == 204
    assert_error(api.get(f"/api/schedules/{made['id']}/"), 404, "not_found")
    assert [s["id"] for s in api.get("/api/schedules/").json()["results"]] == [third["id"], second["id"]]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"every_seconds": 30}, "every_seconds"),  # shorter than RUNLEDGER_MIN_SCHEDULE_SECONDS (60)
        ({"every_seconds": None, "cron": "*/1 * * * *"}, None),  # every minute: 60 s, allowed
        ({"every_seconds": None, "cron": "every day at nine"}, "cron"),
        ({"every_seconds": None, "cron": "61 * * * *"}, "cron"),
        ({"every_seconds": None}, "cron"),  # neither
        ({"cron": "@daily"}, "cron"),  # both
        ({"timezone": "Mars/Olympus_Mons"}, "timezone"),
        ({"agent": "no-such-agent"}, "agent"),
        ({"overlap": "queue_them"}, "overlap"),
        ({"metadata": {"k": 7}}, "metadata"),
        ({"start_at": "2031-01-02T00:00:00Z", "end_at": "2031-01-01T00:00:00Z"}, "end_at"),
        ({"catchup_window_seconds": -1}, "catchup_window_seconds"),
        ({"priority": 1001}, "priority"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_writes_nothing(
    alice: User, body: dict[str, Any], field: str | None
) -> None:
    response = api_for(alice).post("/api/schedules/", {**HOURLY, **body}, format="json")
    if field is None:
        assert response.status_code == 201, response.content
        return
    error = assert_error(response, 400, "validation_error")
    assert field in error["error"]["detail"], error
    assert not Schedule.objects.exists()


def test_a_cron_firing_more_often_than_the_minimum_is_a_400_naming_cron(alice: User, settings: Any) -> None:
    settings.RUNLEDGER_MIN_SCHEDULE_SECONDS = 300
    refused = api_for(alice).post("/api/schedules/", {**HOURLY, "every_seconds": None, "cron": "*/2 * * * *"})
    assert "cron" in assert_error(refused, 400, "validation_error")["error"]["detail"]
    assert create(alice, every_seconds=None, cron="*/5 * * * *")["cron"] == "*/5 * * * *"


def test_the_named_staff_permission_may_schedule_more_often(make_user: Callable[..., User]) -> None:
    often = make_user("often", perms=("runs.schedule_often",), is_staff=True)
    assert create(often, every_seconds=1)["every_seconds"] == 1


def test_a_patch_is_checked_as_a_create(alice: User) -> None:
    made = create(alice)
    api = api_for(alice)
    for body, field in (({"every_seconds": 5}, "every_seconds"), ({"timezone": "Nowhere/City"}, "timezone")):
        error = assert_error(api.patch(f"/api/schedules/{made['id']}/", body, format="json"), 400, "validation_error")
        assert field in error["error"]["detail"]
    assert api.get(f"/api/schedules/{made['id']}/").json() == made  # nothing changed


def test_another_users_schedule_is_a_404_on_every_verb(alice: User, bob: User) -> None:
    hers = create(alice)
    url = f"/api/schedules/{hers['id']}/"
    his = api_for(bob)
    assert his.get("/api/schedules/").json()["results"] == []
    past = {"from": "2020-01-01T00:00:00Z", "to": "2020-01-02T00:00:00Z", "max": 1}
    for method, path, body in (
        ("get", url, None),
        ("patch", url, {"priority": 3}),
        ("patch", url, {"every_seconds": 1}),  # a bad body too: the 404 comes first
        ("delete", url, None),
        ("post", url + "pause/", None),
        ("post", url + "resume/", None),
        ("post", url + "trigger/", None),
        ("post", url + "backfill/", past),
        ("post", url + "backfill/", {"max": "many"}),
    ):
        assert_error(getattr(his, method)(path, body, format="json"), 404, "not_found")
    for malformed in ("not-a-uuid", "00000000-0000-0000-0000-000000000000"):
        assert_error(his.get(f"/api/schedules/{malformed}/"), 404, "not_found")
    assert api_for(alice).get(url).json() == hers  # untouched
    assert not Run.objects.exists()


def test_staff_who_may_change_runs_act_on_anyones_schedule(alice: User, make_user: Callable[..., User]) -> None:
    hers = create(alice)
    staff = api_for(make_user("ops", perms=("runs.change_run",), is_staff=True))
    assert [s["id"] for s in staff.get("/api/schedules/").json()["results"]] == [hers["id"]]
    assert staff.post(f"/api/schedules/{hers['id']}/pause/").json()["paused"] is True


def test_past_the_cap_a_create_is_a_429_and_deleting_one_frees_its_place(alice: User, settings: Any) -> None:
    settings.RUNLEDGER_MAX_SCHEDULES_PER_USER = 2
    first = create(alice)
    create(alice)
    refused = assert_error(api_for(alice).post("/api/schedules/", HOURLY, format="json"), 429, "too_many_requests")
    assert refused["error"]["detail"]
    assert Schedule.objects.count() == 2
    assert api_for(alice).delete(f"/api/schedules/{first['id']}/").status_code == 204
    create(alice)


def test_a_priority_above_100_needs_runs_prioritize_run(alice: User, make_user: Callable[..., User]) -> None:
    # As for a run's create: a 400 naming `priority` (docs/design/fair-use.md#priority).
    refused = api_for(alice).post("/api/schedules/", {**HOURLY, "priority": 500}, format="json")
    assert "priority" in assert_error(refused, 400, "validation_error")["error"]["detail"]
    made = create(alice, priority=100)
    changed = api_for(alice).patch(f"/api/schedules/{made['id']}/", {"priority": 101}, format="json")
    assert "priority" in assert_error(changed, 400, "validation_error")["error"]["detail"]
    assert Schedule.objects.get().priority == 100
    urgent = make_user("urgent", perms=("runs.prioritize_run",))
    assert create(urgent, priority=500)["priority"] == 500


def test_pause_and_resume_answer_the_schedule_and_resume_fires_from_now(alice: User) -> None:
    made = create(alice, every_seconds=60, start_at="2020-01-01T00:00:00Z")
    api = api_for(alice)
    paused = api.post(f"/api/schedules/{made['id']}/pause/")
    assert paused.status_code == 200 and paused.json()["paused"] is True
    assert api.post(f"/api/schedules/{made['id']}/pause/").json()["paused"] is True  # again: no change
    before = db_now()
    resumed = api.post(f"/api/schedules/{made['id']}/resume/").json()
    due = when(resumed["next_due_at"])
    assert resumed["paused"] is False and due is not None and before < due <= before + timedelta(seconds=61)
    # Still anchored on its start: a whole number of intervals after it.
    assert (due - datetime(2020, 1, 1, tzinfo=UTC)).total_seconds() % 60 == 0


def test_trigger_creates_a_run_of_the_schedule_and_skip_refuses_a_second_while_it_is_live(alice: User) -> None:
    made = create(alice, metadata={"team": "a"})
    api = api_for(alice)
    fired = api.post(f"/api/schedules/{made['id']}/trigger/")
    assert fired.status_code == 201, fired.content
    run = fired.json()
    assert set(run) >= RUN_KEYS and run["status"] == "queued" and run["metadata"] == {"team": "a"}
    assert run["schedule"]["id"] == made["id"] and when(run["schedule"]["due_at"]) is not None
    assert api.get(f"/api/schedules/{made['id']}/").json()["last_run"] == {"id": run["id"], "status": "queued"}
    assert [r["id"] for r in api.get(f"/api/runs/?schedule={made['id']}").json()["results"]] == [run["id"]]

    skipped = assert_error(api.post(f"/api/schedules/{made['id']}/trigger/"), 409, "schedule_overlap")
    assert skipped["run"]["id"] == run["id"]  # the live run it waits for
    assert Run.objects.filter(schedule_id=made["id"]).count() == 1
    # buffer_one keeps the fire for when the live run ends: no run now, the same 409.
    api.patch(f"/api/schedules/{made['id']}/", {"overlap": "buffer_one"}, format="json")
    assert_error(api.post(f"/api/schedules/{made['id']}/trigger/"), 409, "schedule_overlap")
    assert Run.objects.filter(schedule_id=made["id"]).count() == 1
    allowed = api.patch(f"/api/schedules/{made['id']}/", {"overlap": "allow_all"}, format="json").json()
    assert allowed["overlap"] == "allow_all"
    assert api.post(f"/api/schedules/{made['id']}/trigger/").status_code == 201
    assert Run.objects.filter(schedule_id=made["id"]).count() == 2
    # cancel_other: the live run cancelled (end code schedule_overlap), a new one created.
    api.patch(f"/api/schedules/{made['id']}/", {"overlap": "cancel_other"}, format="json")
    newest = api.post(f"/api/schedules/{made['id']}/trigger/")
    assert newest.status_code == 201, newest.content
    second = Run.objects.filter(schedule_id=made["id"]).exclude(pk__in=[run["id"], newest.json()["id"]]).get()
    assert (second.status, second.end_code) == ("cancelled", "schedule_overlap")


def test_backfill_creates_the_runs_of_a_past_ranges_due_times_oldest_first_at_most_max(alice: User) -> None:
    made = create(alice, every_seconds=3600, start_at="2020-01-01T00:00:00Z")
    api = api_for(alice)
    url = f"/api/schedules/{made['id']}/backfill/"
    day = {"from": "2020-01-01T00:00:00Z", "to": "2020-01-01T23:59:59Z"}
    done = api.post(url, {**day, "max": 3}, format="json")
    assert done.status_code == 200, done.content
    dues = [run["schedule"]["due_at"] for run in done.json()["runs"]]
    assert [when(d) for d in dues] == [datetime(2020, 1, 1, h, tzinfo=UTC) for h in (0, 1, 2)]
    again = api.post(url, {**day, "max": 2}, format="json").json()["runs"]  # the ones fired are passed over
    assert [when(r["schedule"]["due_at"]) for r in again] == [datetime(2020, 1, 1, h, tzinfo=UTC) for h in (3, 4)]
    assert Run.objects.filter(schedule_id=made["id"]).count() == 5
    for body, field in (
        ({**day, "max": 0}, "max"),
        ({"from": "2020-01-02T00:00:00Z", "to": "2020-01-01T00:00:00Z", "max": 1}, "to"),
        ({"from": "2020-01-01T00:00:00Z", "to": "2999-01-01T00:00:00Z", "max": 1}, "to"),
        ({"to": "2020-01-01T00:00:00Z", "max": 1}, "from"),
    ):
        error = assert_error(api.post(url, body, format="json"), 400, "validation_error")
        assert field in error["error"]["detail"], (body, error)
    assert Run.objects.filter(schedule_id=made["id"]).count() == 5


def test_a_page_of_schedules_costs_the_same_statements_for_3_as_for_30(alice: User) -> None:
    api = api_for(alice)

    def statements() -> int:
        with CaptureQueriesContext(connection) as read:
            page = api.get("/api/schedules/?page_size=50")
        assert page.status_code == 200
        return len(read.captured_queries)

    for _ in range(3):
        api.post(f"/api/schedules/{create(alice)['id']}/trigger/")  # each with a last run to show
    few = statements()
    for _ in range(27):
        api.post(f"/api/schedules/{create(alice)['id']}/trigger/")
    assert statements() == few
    assert all(s["last_run"]["status"] == "queued" for s in api.get("/api/schedules/").json()["results"])


def test_a_page_of_schedules_reads_of_each_last_run_its_id_and_status_not_its_input(alice: User) -> None:
    # A schedule's input is its runs' input: up to the input cap each, which a page of schedules
    # must not read a second time through their last runs.
    api = api_for(alice)
    made = create(alice, input={"deltas": 1, "delay_ms": 0, "note": "x" * 50_000})
    api.post(f"/api/schedules/{made['id']}/trigger/")
    with CaptureQueriesContext(connection) as read:
        page = api.get("/api/schedules/").json()["results"]
    assert page[0]["last_run"]["status"] == "queued" and len(page[0]["input"]["note"]) == 50_000
    run_table = Run._meta.db_table
    joined = [q["sql"] for q in read.captured_queries if f'JOIN "{run_table}"' in q["sql"]]
    assert joined, "the last run is read with the schedule"
    for heavy in ("input", "output", "error"):
        assert all(f'"{run_table}"."{heavy}"' not in sql for sql in joined), heavy
