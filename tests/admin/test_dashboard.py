"""The staff dashboard: who may open it, a query count that does not grow with the
tables, and what its queue age and cancel → released latencies count — the same as /metrics/.
What it shows, in a real browser, is tests/admin/test_dashboard_browser.py."""

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from runs import services
from runs.events import RequeueCause
from runs.models import AttemptOutcome, Run, RunAttempt
from runs.selectors.clock import db_now
from runs.selectors.overview import system_overview
from runs.transitions import StopCode
from tests.factories import queued_run, running_run, waiting_run
from tests.support.metrics import Families, parse, value
from tests.support.runs import attempt, fresh
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite, pytest.mark.timeout(120)]

URL = "/admin/runs/dashboard/"


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("url", [URL, URL + "?figures=1"])
def test_anonymous_and_non_staff_are_sent_to_log_in_and_staff_without_view_run_get_403(
    make_user: Callable[..., User], url: str
) -> None:
    response = Client().get(url)
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/?next=/admin/runs/dashboard/")
    # The admin site's own rule: a user who is not staff is sent to log in, permission or not.
    outsider = make_user("outsider", perms=("runs.view_run",))
    assert logged_in(outsider).get(url).status_code == 302
    staff = make_user("staff-no-view", perms=("runs.cancel_run", "runs.stop_run"), is_staff=True)
    assert logged_in(staff).get(url).status_code == 403
    for perm in ("runs.view_run", "runs.change_run"):
        assert logged_in(make_user(perms=(perm,), is_staff=True)).get(url).status_code == 200


def test_the_admin_index_and_the_run_list_link_to_it(make_user: Callable[..., User]) -> None:
    client = logged_in(make_user("oncall", perms=("runs.view_run",), is_staff=True))
    for page in ("/admin/", "/admin/runs/run/"):
        assert f'href="{URL}"' in client.get(page).content.decode(), page


def _history(owner: User, size: int) -> None:
    """`size` runs of each kind the dashboard counts: ended with events, cancelled while running and
    released, live in every state, held by a worker."""
    for _ in range(size):
        run = running_run(owner, input={"deltas": 2})
        services.run_events_append(
            run_id=run.pk, generation=run.generation, events=[("output.delta", {"text": "x"})] * 5
        )
        services.run_complete(run_id=run.pk, generation=run.generation, output={"text": "x"})
        run = running_run(owner)
        services.run_cancel(run_id=run.pk, actor=owner)
        services.run_attempt_release(run_id=run.pk, generation=run.generation)
        waiting_run(owner)
        running_run(owner)
    # Queued last: a claim above would take them first.
    for _ in range(size):
        queued_run(owner)


def _queries(client: Client) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(URL).status_code == 200
        assert client.get(URL + "?figures=1").status_code == 200
    return [q["sql"] for q in captured.captured_queries]


def test_the_pages_queries_do_not_grow_with_the_runs(make_user: Callable[..., User], alice: User) -> None:
    client = logged_in(make_user("oncall", perms=("runs.view_run",), is_staff=True))
    _history(alice, 2)
    small = _queries(client)
    for run in Run.objects.filter(status="queued"):  # so that the next claims take their own runs
        services.run_cancel(run_id=run.pk, actor=alice)
    _history(alice, 20)
    large = _queries(client)
    assert len(large) == len(small)
    # Two pages, each: the session, the user, their two permission sets, the database's clock
    # (PostgreSQL), the six reads of the figures, the usage by agent, the failing webhook endpoints
    # and the late schedules.
    assert len(small) <= 2 * 14, small


# --- what the figures count, as /metrics/ does -------------------------------------------------------

METRICS_TOKEN = "scrape-me-0123456789"
COUNT, SUM = "runledger_cancel_release_seconds_count", "runledger_cancel_release_seconds_sum"


def _metrics() -> Families:
    response = Client().get("/metrics/", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert response.status_code == 200
    return parse(response.content.decode())


def _last_attempt(run: Run) -> RunAttempt:
    held = attempt(run, run.generation)
    assert held is not None
    return held


def _latency(run: Run) -> float:
    run, released = fresh(run), _last_attempt(run)
    assert run.ended_at is not None and released.released_at is not None
    return max(0.0, (released.released_at - run.ended_at).total_seconds())


@pytest.mark.django_db(transaction=True)  # /metrics/ counts what committed
def test_cancel_latencies_count_every_attempt_a_cancel_or_stop_ended_as_metrics_do(alice: User, settings: Any) -> None:
    settings.RUNLEDGER_METRICS_TOKEN = METRICS_TOKEN
    before = _metrics()
    counted: list[float] = []

    # Released by their worker once cancelled, or stopped.
    cancelled, stopped = running_run(alice), running_run(alice)
    services.run_cancel(run_id=cancelled.pk, actor=alice)
    services.run_stop(run_id=stopped.pk, actor=None, code=StopCode.POLICY, reason="over the allowed runtime")
    for run in (cancelled, stopped):
        services.run_attempt_release(run_id=run.pk, generation=run.generation)
        counted.append(_latency(run))

    # Cancelled while its worker was gone: a sweeper releases it as of its lease's lapse, `lost`.
    settings.RUNLEDGER_LEASE_SECONDS = 1
    orphan = running_run(alice)
    services.run_cancel(run_id=orphan.pk, actor=alice)
    lapse = _last_attempt(orphan).lease_expires_at
    services.runs_sweep(as_of=lapse + timedelta(seconds=1))
    assert _last_attempt(orphan).outcome == AttemptOutcome.LOST
    counted.append(_latency(orphan))
    assert counted[-1] > 0

    # Its lease lapsed before the cancel and no sweeper had requeued it yet: released as of the
    # lapse, which is before the cancel, so it counts as released at the cancel.
    settings.RUNLEDGER_LEASE_SECONDS = 0
    lapsed = running_run(alice)
    _wait_lapsed(lapsed)
    services.run_cancel(run_id=lapsed.pk, actor=alice)
    services.runs_sweep()
    assert _last_attempt(lapsed).outcome == AttemptOutcome.LOST
    counted.append(_latency(lapsed))
    assert counted[-1] == 0

    # Not ended by a cancel or stop: an attempt lost to its lapsed lease, whose run went back to
    # the queue and was cancelled there; one that parked its run, cancelled while waiting.
    requeued = running_run(alice)
    _wait_lapsed(requeued)
    services.runs_sweep()
    assert fresh(requeued).status == "queued"
    services.run_cancel(run_id=requeued.pk, actor=alice)
    parked = waiting_run(alice)
    services.run_cancel(run_id=parked.pk, actor=alice)

    wait_until(lambda: db_now() > lapse, what="the orphan's release, as of its lease's lapse, in the past")
    overview = system_overview(now=db_now())
    after = _metrics()
    assert sorted(overview.cancel_latency_day.seconds) == pytest.approx(sorted(counted))
    assert overview.cancel_latency_hour.seconds == overview.cancel_latency_day.seconds
    assert value(after, COUNT) - value(before, COUNT) == len(counted)
    assert value(after, SUM) - value(before, SUM) == pytest.approx(sum(counted))


def _wait_lapsed(run: Run) -> None:
    # A lease of 0 s lapses once the clock has moved past its claim: on SQLite, whose clock reads
    # to the millisecond, a sweep within that millisecond rightly finds it still held.
    lease = _last_attempt(run).lease_expires_at
    wait_until(lambda: db_now() > lease, what="the lease's lapse")


@pytest.mark.django_db(transaction=True)
def test_the_queue_age_counts_from_when_a_run_last_entered_the_queue(alice: User, settings: Any) -> None:
    settings.RUNLEDGER_METRICS_TOKEN = METRICS_TOKEN
    first = running_run(alice)
    # Created long ago: counted from its creation, its age would be a day.
    Run.objects.filter(pk=first.pk).update(created_at=first.created_at - timedelta(days=1))
    waiting = waiting_run(alice)
    second = queued_run(alice)
    services.run_requeue(run_id=first.pk, generation=first.generation, cause=RequeueCause.WORKER_SHUTDOWN)
    services.run_resume(run_id=waiting.pk, ticket=fresh(waiting).resume_ticket)
    first, second, waiting = fresh(first), fresh(second), fresh(waiting)
    assert first.created_at < second.queued_at < first.queued_at < waiting.queued_at

    # Created before the others, the requeued run entered the queue after the second one.
    assert system_overview(now=db_now()).queue_oldest == second.queued_at
    services.run_cancel(run_id=second.pk, actor=alice)
    assert system_overview(now=db_now()).queue_oldest == first.queued_at
    earliest, age, latest = db_now(), value(_metrics(), "runledger_queue_oldest_age_seconds"), db_now()
    assert (earliest - first.queued_at).total_seconds() <= age <= (latest - first.queued_at).total_seconds()
    services.run_cancel(run_id=first.pk, actor=alice)
    assert system_overview(now=db_now()).queue_oldest == waiting.queued_at
