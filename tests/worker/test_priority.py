"""A run's priority and start time (docs/design/fair-use.md#priority, #start-after): the claim
orders an owner's own runs by priority without moving them ahead of another owner, takes a staff
priority before fair share, and leaves a run alone until its start_after; a worker wakes for it.

The claim order is proven on both databases through `run_claim`, and with real worker processes
where the worker's own claim loop and wake-up are the point."""

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import psycopg
import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.db import connection, transaction
from django.db.models.functions import Now
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from rest_framework.test import APIClient

from runs import notify, services
from runs.events import EventType
from runs.models import Run, RunEvent
from runs.notify import conninfo
from runs.selectors.clock import db_now
from runs.selectors.overview import queue_oldest_entered
from runs.selectors.states import queue_next_start_in
from runs.services.statements import SEPARATOR
from runs.transitions import Status
from runs.worker.worker import Worker
from tests.factories import queued_run, running_run
from tests.support.procs import Procs, subprocess_env
from tests.support.runs import event_types, fresh
from tests.support.workers import wait_status

pytestmark = pytest.mark.django_db(transaction=True)

QUICK = {"deltas": 2, "delay_ms": 1}
LONG = {"deltas": 1000, "delay_ms": 100}


def api_for(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def claimed_id() -> Any:
    claimed = services.run_claim(worker="w")
    return None if claimed is None else claimed[0].pk


def started_at(run: Run) -> datetime:
    """When the committed run.started event of its first attempt says it started."""
    return RunEvent.objects.get(run=run, type=EventType.RUN_STARTED, attempt=1).created_at


@pytest.fixture
def staff(make_user: Callable[..., User]) -> User:
    return make_user("staff", perms=("runs.prioritize_run",))


# --- priority: the claim's order -------------------------------------------------------------------


@pytest.mark.sqlite
def test_an_owners_higher_priority_run_is_claimed_before_their_older_ones(alice: User) -> None:
    older = queued_run(alice)
    low = queued_run(alice, priority=-3)
    high = queued_run(alice, priority=5)
    assert [claimed_id() for _ in range(4)] == [high.pk, older.pk, low.pk, None]


@pytest.mark.sqlite
def test_a_priority_never_moves_an_owner_ahead_of_another(alice: User, bob: User) -> None:
    """Alice's priority-5 run takes the turn her older run had; Bob's, created between them, still
    comes next, and her older run takes the later turn."""
    alices_older = queued_run(alice)
    bobs = queued_run(bob)
    alices_urgent = queued_run(alice, priority=5)
    assert [claimed_id() for _ in range(3)] == [alices_urgent.pk, bobs.pk, alices_older.pk]


@pytest.mark.sqlite
def test_fair_share_still_counts_running_runs_first(alice: User, bob: User) -> None:
    running_run(bob, input=LONG)
    bobs = queued_run(bob, priority=100)
    alices = queued_run(alice, priority=-100)
    assert [claimed_id() for _ in range(2)] == [alices.pk, bobs.pk]


@pytest.mark.sqlite
def test_a_staff_priority_is_claimed_before_any_fair_share_pick(alice: User, bob: User, staff: User) -> None:
    running_run(staff, input=LONG)
    alices = queued_run(alice)
    bobs = queued_run(bob, priority=100)
    lower, higher = queued_run(staff, priority=101), queued_run(staff, priority=500)
    assert [claimed_id() for _ in range(4)] == [higher.pk, lower.pk, alices.pk, bobs.pk]


@pytest.mark.sqlite
@override_settings(RUNLEDGER_MAX_RUNNING_PER_USER=1)
def test_a_staff_priority_jumps_the_line_not_the_running_cap(alice: User, staff: User) -> None:
    running_run(staff, input=LONG)
    urgent = queued_run(staff, priority=1000)
    alices = queued_run(alice)
    assert [claimed_id() for _ in range(2)] == [alices.pk, None]
    assert fresh(urgent).status == "queued"


@pytest.mark.sqlite
def test_a_child_shares_its_parents_priority(alice: User, staff: User) -> None:
    parent = running_run(staff, priority=300)
    child = services.run_child_spawn(run_id=parent.pk, generation=1, input=QUICK)
    assert child.priority == 300


# --- priority and start_after through the API ------------------------------------------------------


@pytest.mark.sqlite
@pytest.mark.parametrize(
    ("priority", "field_says"),
    [
        (101, "above 100 needs the runs.prioritize_run permission"),
        (1001, "must be between -100 and 100"),
        (-101, "must be between -100 and 100"),
        (None, "may not be null"),
        ("high", "valid integer"),
    ],
)
def test_a_priority_out_of_bounds_is_a_400_naming_it_and_writes_nothing(
    alice: User, priority: Any, field_says: str
) -> None:
    answer = api_for(alice).post("/api/runs/", {"agent": "demo", "input": {}, "priority": priority}, format="json")
    assert answer.status_code == 400, answer.json()
    assert field_says in str(answer.json()["error"]["detail"]["priority"])
    assert not Run.objects.exists()


@pytest.mark.sqlite
def test_the_run_json_carries_priority_and_start_after(alice: User, staff: User) -> None:
    at = "2031-01-02T03:04:05.678000Z"
    made = api_for(alice).post(
        "/api/runs/", {"agent": "demo", "input": {}, "priority": -7, "start_after": at}, format="json"
    )
    assert made.status_code == 201, made.json()
    assert (made.json()["priority"], made.json()["start_after"]) == (-7, at)
    read = api_for(alice).get(f"/api/runs/{made.json()['id']}/").json()
    assert (read["priority"], read["start_after"]) == (-7, at)
    assert api_for(alice).get("/api/runs/").json()["results"][0]["priority"] == -7
    urgent = api_for(staff).post("/api/runs/", {"agent": "demo", "input": {}, "priority": 1000}, format="json")
    assert urgent.status_code == 201 and urgent.json()["start_after"] is None


@pytest.mark.sqlite
def test_a_deadline_before_the_start_time_is_a_400_and_the_default_one_counts_from_it(alice: User) -> None:
    start = db_now() + timedelta(days=2)
    body = {"agent": "demo", "input": {}, "start_after": start.isoformat(), "deadline": start.isoformat()}
    refused = api_for(alice).post("/api/runs/", body, format="json")
    assert refused.status_code == 400 and "start_after" in refused.json()["error"]["detail"]
    assert not Run.objects.exists()
    run = queued_run(alice, start_after=start)
    assert run.deadline == start + timedelta(days=1)  # RUNLEDGER_DEFAULT_DEADLINE_SECONDS after it


# --- start_after -----------------------------------------------------------------------------------


@pytest.mark.sqlite
def test_a_run_is_not_claimed_before_its_start_after(alice: User, bob: User) -> None:
    later = queued_run(alice, start_after=db_now() + timedelta(hours=1))
    assert claimed_id() is None
    assert queue_oldest_entered() is None  # the queue's age (dashboard, metrics) counts from its time
    bobs = queued_run(bob)
    assert [claimed_id(), claimed_id()] == [bobs.pk, None]
    assert 3590 < (queue_next_start_in() or 0) <= 3600
    Run.objects.filter(pk=later.pk).update(start_after=db_now() - timedelta(seconds=1))
    assert (claimed_id(), queue_next_start_in()) == (later.pk, None)


@pytest.mark.sqlite
def test_a_scheduled_run_takes_its_turn_when_it_falls_due(alice: User, bob: User) -> None:
    """Its place among owners counts from its start_after, not from when it was made."""
    start = db_now() + timedelta(hours=1)
    bobs = queued_run(bob, start_after=start + timedelta(minutes=1))
    alices = queued_run(alice, start_after=start)
    assert bobs.created_at < alices.created_at
    Run.objects.filter(pk__in=[alices.pk, bobs.pk]).update(start_after=db_now())
    assert [claimed_id(), claimed_id()] == [alices.pk, bobs.pk]


@pytest.mark.sqlite
def test_a_scheduled_run_can_be_cancelled_before_it_starts(alice: User) -> None:
    run = queued_run(alice, start_after=db_now() + timedelta(hours=1))
    answer = api_for(alice).post(f"/api/runs/{run.pk}/cancel/", {}, format="json")
    assert answer.status_code == 200 and answer.json()["status"] == "cancelled"
    assert event_types(run) == ["run.created", "run.cancelled"]
    assert queue_next_start_in() is None


def slow_poll() -> dict[str, str]:
    return subprocess_env(RUNLEDGER_POLL_SECONDS="60")


# --- real workers ----------------------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_one_slot_starts_the_staff_run_then_the_owners_priority_then_fair_share(
    procs: Procs, alice: User, bob: User, staff: User
) -> None:
    alices_older = queued_run(alice, input=QUICK)
    bobs = queued_run(bob, input=QUICK)
    alices_high = queued_run(alice, input=QUICK, priority=5)
    staffs = queued_run(staff, input=QUICK, priority=500)
    procs.worker("w1", concurrency=1)
    runs = [wait_status(r, "completed", timeout=30) for r in (alices_older, bobs, alices_high, staffs)]
    order = sorted(runs, key=started_at)
    assert [r.pk for r in order] == [staffs.pk, alices_high.pk, bobs.pk, alices_older.pk]


@pytest.mark.sqlite
@pytest.mark.timeout(90)
def test_a_run_starts_within_a_second_after_its_start_after_and_a_cancelled_one_never(
    procs: Procs, alice: User
) -> None:
    # On PostgreSQL a poll far longer than the wait: only the worker's wake-up for the start time can
    # start it in time. (On SQLite, with no notifications, workers poll every 0.1 s here.)
    procs.worker("w1", env=slow_poll())
    start = db_now() + timedelta(seconds=3)
    run = queued_run(alice, input=QUICK, start_after=start)
    # Announced while the wake-up for `run` stands: its time is read again once `run` is claimed.
    after = queued_run(alice, input=QUICK, start_after=start + timedelta(seconds=2))
    # Due before it: once the worker has started `run`, it has passed this one's time.
    cancelled = queued_run(alice, input=QUICK, start_after=start - timedelta(seconds=1))
    services.run_cancel(run_id=cancelled.pk, actor=alice)
    for each, due in ((run, start), (after, start + timedelta(seconds=2))):
        late = (started_at(wait_status(each, "completed", timeout=20)) - due).total_seconds()
        assert 0 <= late < 1, late
    assert event_types(cancelled) == ["run.created", "run.cancelled"]


def test_a_create_scheduled_ahead_tells_the_workers_when_it_falls_due_and_one_due_now_to_claim(
    alice: User,
) -> None:
    """A run not due yet wakes no claim (which would find nothing): the queue's note carries the
    seconds until its start, by the database's clock; a run due now is a plain note, a claim."""
    with psycopg.connect(**conninfo(), autocommit=True) as listening:
        listening.execute(f'LISTEN "{notify.QUEUE}"')
        later = queued_run(alice, start_after=db_now() + timedelta(hours=1))
        due = queued_run(alice)
        notes = [note.payload for note in listening.notifies(timeout=10, stop_after=2)]
    assert notify.parse_queue_payload(notes[1]) is None and notes[1] == str(due.pk)
    run_id, _, _ = notes[0].partition(":")
    ahead = notify.parse_queue_payload(notes[0])
    assert run_id == str(later.pk) and ahead is not None and 3590 < ahead <= 3600, notes[0]


@pytest.mark.timeout(30)
def test_a_worker_told_of_a_run_due_later_wakes_its_claims_then_and_not_before() -> None:
    """The worker's side of the note above: the soonest announced start arms its wake-up, a later one
    leaves it armed, and a note of a run due now wakes its claims at once."""
    worker = Worker(worker_id="w", listen=False)

    async def told() -> tuple[bool, float, bool]:
        loop = asyncio.get_running_loop()
        worker._loop, worker._wake = loop, asyncio.Event()
        told_at = loop.time()
        worker._on_notify(notify.QUEUE, f"{uuid4()}:0.5")
        worker._on_notify(notify.QUEUE, f"{uuid4()}:3600")
        woken_at_once = worker._wake.is_set()
        await asyncio.wait_for(worker._wake.wait(), timeout=10)
        waited = loop.time() - told_at
        worker._wake.clear()
        worker._on_notify(notify.QUEUE, str(uuid4()))
        return woken_at_once, waited, worker._wake.is_set()

    woken_at_once, waited, woken_for_a_run_due_now = asyncio.run(told())
    assert not woken_at_once and 0.5 <= waited < 5 and woken_for_a_run_due_now, waited


@pytest.mark.timeout(30)
def test_a_worker_reads_the_next_start_again_after_its_wake_up_not_after_a_create_of_a_run_due_now() -> None:
    """The soonest start ahead is read again only after a wake that may have passed it (the wake-up
    for it, the poll, a reconnect): a create's note of a run due now cannot change it."""
    worker = Worker(worker_id="w", listen=False)

    async def reads() -> list[bool]:
        worker._loop, worker._wake = asyncio.get_running_loop(), asyncio.Event()
        seen = [worker._read_start]  # nothing read yet
        worker._read_start = False  # as once read
        worker._on_notify(notify.QUEUE, str(uuid4()))
        seen.append(worker._read_start)
        worker._wake.clear()
        worker._on_notify(notify.QUEUE, f"{uuid4()}:0.2")
        await asyncio.wait_for(worker._wake.wait(), timeout=10)
        return [*seen, worker._read_start]

    assert asyncio.run(reads()) == [True, False, True]


# --- the staff console -----------------------------------------------------------------------------


def priority_url(run: Run) -> str:
    return reverse("admin:runs_run_priority", args=[run.pk])


@pytest.mark.sqlite
def test_the_admin_shows_a_runs_priority_and_start_time(make_user: Callable[..., User], alice: User) -> None:
    viewer = make_user("looker", perms=("runs.view_run",), is_staff=True)
    run = queued_run(alice, priority=42, start_after=datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC))
    client = Client()
    client.force_login(viewer)
    page = client.get(reverse("admin:runs_run_change", args=[run.pk])).content.decode()
    assert "2031-01-02 03:04:05" in page and ">42<" in page
    assert priority_url(run) not in page  # without runs.prioritize_run: no button
    assert ">42<" in client.get("/admin/runs/run/").content.decode()
    assert client.post(priority_url(run), {"priority": "7"}).status_code == 403
    assert fresh(run).priority == 42


@pytest.mark.sqlite
def test_staff_set_a_queued_runs_priority_and_start_from_its_page(
    make_user: Callable[..., User], alice: User, bob: User
) -> None:
    scheduler = make_user("queue", perms=("runs.view_run", "runs.prioritize_run"), is_staff=True)
    client = Client()
    client.force_login(scheduler)
    alices = queued_run(alice, start_after=db_now() + timedelta(hours=1))
    bobs = queued_run(bob)
    assert priority_url(alices) in client.get(reverse("admin:runs_run_change", args=[alices.pk])).content.decode()
    form = client.get(priority_url(alices))
    assert form.status_code == 200 and 'name="priority"' in form.content.decode()

    done = client.post(priority_url(alices), {"priority": "500", "start_after": ""})
    assert done.status_code == 302
    assert (fresh(alices).priority, fresh(alices).start_after) == (500, None)
    assert LogEntry.objects.filter(object_id=str(alices.pk), change_message__startswith="Priority and start").exists()
    assert claimed_id() == alices.pk  # due now, and above fair share: before Bob's older run

    refused = client.post(priority_url(bobs), {"priority": "1001"})
    assert refused.status_code == 200 and fresh(bobs).priority == 0
    too_late = client.post(priority_url(bobs), {"priority": "1", "start_after": "2200-01-01 00:00:00"})
    assert "must be before the deadline" in too_late.content.decode() and fresh(bobs).start_after is None
    claimed_id()
    ran = client.post(priority_url(bobs), {"priority": "3"})
    assert ran.status_code == 302 and fresh(bobs).priority == 0  # running now: not changed, said so
    assert any("only a queued run" in str(m) for m in get_messages(ran.wsgi_request))
    assert client.get(priority_url(bobs)).status_code == 302


@pytest.mark.sqlite
def test_rescheduling_a_run_later_takes_it_out_of_the_line_until_then(alice: User, bob: User, staff: User) -> None:
    alices = queued_run(alice)
    bobs = queued_run(bob)
    later = db_now() + timedelta(hours=1)
    assert services.run_schedule(run_id=alices.pk, actor=staff, priority=0, start_after=later).changed
    assert not services.run_schedule(run_id=alices.pk, actor=staff, priority=0, start_after=later).changed
    assert (claimed_id(), claimed_id()) == (bobs.pk, None)
    services.run_schedule(run_id=alices.pk, actor=staff, priority=0, start_after=None)
    assert claimed_id() == alices.pk


# --- the claim's indexes ---------------------------------------------------------------------------


def test_the_claim_reads_each_of_its_rows_through_a_partial_index_of_the_queue(
    alice: User, bob: User, staff: User, make_user: Callable[..., User]
) -> None:
    """PostgreSQL: with sequential scans off, every statement of a claim and of the worker's
    next-start read has a plan on the queue's partial indexes; the picks keep SKIP LOCKED. The
    table is analyzed as it stands, mostly ended runs and a queue, so the plans follow the test's
    rows, not the statistics another test's rows left behind (those once had the planner pick
    another tiny partial index for the urgent pick)."""
    others = [make_user(f"owner{i}") for i in range(10)]
    ended = [queued_run(others[i % 10]).pk for i in range(200)]
    Run.objects.filter(pk__in=ended).update(status=Status.COMPLETED, ended_at=Now())
    for i in range(50):
        queued_run(others[i % 10])
    queued_run(alice), queued_run(alice, priority=5), queued_run(bob, start_after=db_now() + timedelta(hours=1))
    queued_run(staff, priority=200)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE runs_run")  # inside the test's transaction: its own rows, rolled back after
    with CaptureQueriesContext(connection) as urgent_claim:
        claimed_id()
    with CaptureQueriesContext(connection) as fair_claim:
        claimed_id()  # the pick of the owner whose turn comes first (owner0, queued before Alice)
    with CaptureQueriesContext(connection) as next_start:
        queue_next_start_in()
    plans = []
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        for query in [*urgent_claim.captured_queries, *fair_claim.captured_queries, *next_start.captured_queries]:
            for sql in query["sql"].split(SEPARATOR):  # a send of several (runs.services.statements)
                if sql.lstrip().upper().startswith(("SELECT", "WITH")):
                    cursor.execute("EXPLAIN " + sql)
                    plans.append("\n".join(row[0] for row in cursor.fetchall()))
        transaction.set_rollback(True)
    used = "\n".join(plans)
    for index in ("run_queued_urgent", "run_queued_turn", "run_queued_pick", "run_queued_start"):
        assert index in used, index
    picks = [
        q["sql"] for q in [*urgent_claim.captured_queries, *fair_claim.captured_queries] if "FOR NO KEY" in q["sql"]
    ]
    assert picks and all("SKIP LOCKED" in sql for sql in picks)
