"""The sweeper's services: lapsed leases and deadlines, alone and racing
(docs/design/execution.md#sweeper).

Time cannot be moved forward, so the sweeper is told what time it is (`as_of`) where a test needs
a lease or a deadline in the past; everything else is the real clock and real transactions.
"""

from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from pytest_django import Settings

from runs import services
from runs.exceptions import StaleAttempt, StaleTicket
from runs.models import AttemptOutcome, Run, RunAttempt, RunEvent
from tests.factories import assert_log_is_sound, queued_run, running_run, waiting_run
from tests.support.runs import assert_stopped_by_the_system, event_types
from tests.support.threads import race

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite]


def lease_of(run: Run, generation: int = 1) -> datetime:
    return RunAttempt.objects.get(run=run, generation=generation).lease_expires_at


def after_lease(run: Run, generation: int = 1) -> datetime:
    return lease_of(run, generation) + timedelta(milliseconds=1)


# --- lapsed leases ---------------------------------------------------------------------------------


def test_a_fresh_lease_is_left_alone(alice: User) -> None:
    run = running_run(alice)
    assert not services.runs_sweep()
    assert not services.runs_sweep(as_of=lease_of(run))  # expires *after* that instant
    run.refresh_from_db()
    assert (run.status, run.generation, run.lost_attempts) == ("running", 1, 0)


def test_a_lapsed_lease_is_requeued_and_the_old_attempt_is_fenced(alice: User) -> None:
    run = running_run(alice)

    swept = services.runs_sweep(as_of=after_lease(run))

    assert swept.requeued == (run.pk,) and not swept.failed and not swept.stopped
    run.refresh_from_db()
    assert (run.status, run.lost_attempts, run.generation) == ("queued", 1, 1)
    old = RunAttempt.objects.get(run=run, generation=1)
    # Lost, and released as of its lease's lapse: by then its worker, if alive, fenced itself.
    assert (old.outcome, old.released_at) == (AttemptOutcome.LOST, old.lease_expires_at)
    last = RunEvent.objects.get(run=run, seq=run.last_seq)
    assert (last.type, last.data, last.attempt) == (
        "run.requeued",
        {"generation": 1, "cause": "lease_expired"},
        None,
    )
    # The old attempt can no longer write, renew, or end the run.
    with pytest.raises(StaleAttempt):
        services.run_events_append(run_id=run.pk, generation=1, events=[("output.delta", {"text": "late"})])
    with pytest.raises(StaleAttempt):
        services.run_complete(run_id=run.pk, generation=1, output=None)
    assert not services.run_attempt_heartbeat(run_id=run.pk, generation=1)
    # The next claim opens the next generation.
    claimed = services.run_claim(worker="w2")
    assert claimed is not None and claimed[1].generation == 2
    assert_log_is_sound(run)


def test_a_lapsed_lease_past_max_attempts_fails_the_run_worker_lost(alice: User) -> None:
    run = running_run(alice, max_attempts=2)
    services.runs_sweep(as_of=after_lease(run))
    assert services.run_claim(worker="w2") is not None

    swept = services.runs_sweep(as_of=after_lease(run, 2))

    assert swept.failed == (run.pk,) and not swept.requeued
    run.refresh_from_db()
    assert (run.status, run.end_code, run.ended_by, run.lost_attempts) == ("failed", "worker_lost", "system", 2)
    assert list(RunAttempt.objects.filter(run=run).values_list("outcome", flat=True)) == ["lost", "lost"]
    assert event_types(run).count("run.requeued") == 1
    assert_log_is_sound(run)


def test_a_lease_renewed_after_the_sweep_looked_is_not_requeued(alice: User, settings: Settings) -> None:
    run = running_run(alice)
    stale_view = after_lease(run)  # what a sweeper saw: the lease had lapsed
    settings.RUNLEDGER_LEASE_SECONDS = 3600
    assert services.run_attempt_heartbeat(run_id=run.pk, generation=1)

    # The re-check under the lock reads the renewed lease.
    assert services.run_lease_expire(run_id=run.pk, generation=1, as_of=stale_view) is None
    run.refresh_from_db()
    assert (run.status, run.lost_attempts) == ("running", 0)


def test_a_run_that_moved_on_is_not_requeued_for_an_old_attempt(alice: User) -> None:
    run = running_run(alice)
    services.run_requeue(run_id=run.pk, generation=1, cause="worker_shutdown")
    assert services.run_claim(worker="w2") is not None

    assert services.run_lease_expire(run_id=run.pk, generation=1, as_of=after_lease(run, 2)) is None
    run.refresh_from_db()
    assert (run.status, run.generation, run.lost_attempts) == ("running", 2, 0)


def test_an_attempt_its_worker_gave_up_is_requeued_once_its_lease_lapses(alice: User) -> None:
    run = running_run(alice)
    stopped_at = timezone.now()
    # The worker could not renew and stopped the attempt itself before the lease lapsed.
    services.run_attempt_release(run_id=run.pk, generation=1, outcome=AttemptOutcome.ABANDONED, released_at=stopped_at)
    assert not services.runs_sweep(as_of=lease_of(run))  # the lease still holds the run

    swept = services.runs_sweep(as_of=after_lease(run))

    assert swept.requeued == (run.pk,)
    old = RunAttempt.objects.get(run=run, generation=1)
    assert (old.outcome, old.released_at) == (AttemptOutcome.LOST, stopped_at)


def test_sweepers_racing_requeue_and_stop_each_run_exactly_once(alice: User) -> None:
    leased = [running_run(alice) for _ in range(8)]
    overdue = [
        waiting_run(alice, deadline=timezone.now() + timedelta(hours=1)),
        queued_run(alice, deadline=timezone.now() + timedelta(hours=1)),
    ]
    as_of = max(after_lease(run) for run in leased) + timedelta(hours=2)

    results = race(4, lambda i: services.runs_sweep(as_of=as_of))

    assert not [r for r in results if isinstance(r, BaseException)], results
    requeued = [run_id for r in results for run_id in r.requeued]
    stopped = [run_id for r in results for run_id in r.stopped]
    assert sorted(requeued) == sorted(run.pk for run in leased)  # each exactly once
    assert sorted(stopped) == sorted(run.pk for run in overdue)
    for run in leased:
        run.refresh_from_db()
        assert (run.status, run.lost_attempts) == ("queued", 1)
        assert event_types(run).count("run.requeued") == 1
        assert_log_is_sound(run)
    for run in overdue:
        assert event_types(run).count("run.stopped") == 1
        assert_log_is_sound(run)


# --- deadlines -------------------------------------------------------------------------------------


def test_live_runs_past_their_deadline_are_stopped_deadline_exceeded(alice: User, settings: Settings) -> None:
    settings.RUNLEDGER_LEASE_SECONDS = 86400  # the running run's lease outlasts its deadline
    deadline = timezone.now() + timedelta(hours=1)
    # Claimed runs first: a claim takes the oldest queued run.
    running = running_run(alice, deadline=deadline)
    waiting = waiting_run(alice, deadline=deadline)
    ticket = waiting.resume_ticket
    queued = queued_run(alice, deadline=deadline)
    later = queued_run(alice, deadline=deadline + timedelta(hours=2))
    no_deadline = queued_run(alice)
    ended = queued_run(alice, deadline=deadline)
    services.run_cancel(run_id=ended.pk, actor=alice)

    assert not services.runs_sweep()  # nothing is past its deadline yet
    swept = services.runs_sweep(as_of=deadline + timedelta(seconds=1))

    assert sorted(swept.stopped) == sorted([queued.pk, running.pk, waiting.pk])
    for run in (queued, running, waiting):
        reason = f"deadline {deadline.isoformat()} passed"
        assert_stopped_by_the_system(run, "deadline_exceeded", reason, partial_output=False)
        assert_log_is_sound(run)
    # The running run's attempt is closed; its worker records the release once it has stopped.
    attempt = RunAttempt.objects.get(run=running)
    assert (attempt.outcome, attempt.released_at) == (AttemptOutcome.STOPPED, None)
    with pytest.raises(StaleTicket):
        services.run_resume(run_id=waiting.pk, ticket=ticket)
    for run in (later, no_deadline):
        run.refresh_from_db()
        assert run.status == "queued"
    ended.refresh_from_db()
    assert ended.end_code == "cancelled_by_user"


def test_a_deadline_stop_stops_the_runs_descendants(alice: User) -> None:
    deadline = timezone.now() + timedelta(hours=1)
    parent = running_run(alice, deadline=deadline)
    child = services.run_child_spawn(run_id=parent.pk, generation=1, input={"deltas": 1})

    services.runs_sweep(as_of=deadline + timedelta(seconds=1))

    child.refresh_from_db()
    assert (child.status, child.end_code, child.ended_by) == ("stopped", "parent_stopped", "system")
    assert_log_is_sound(child)


def test_a_queued_run_past_its_deadline_is_never_claimed_but_stopped(alice: User) -> None:
    overdue = queued_run(alice, deadline=timezone.now() - timedelta(seconds=1))
    fresh = queued_run(alice)

    claimed = services.run_claim(worker="w")
    assert claimed is not None and claimed[0].pk == fresh.pk
    assert services.run_claim(worker="w") is None

    assert services.runs_sweep().stopped == (overdue.pk,)  # the real clock, no as_of
    overdue.refresh_from_db()
    assert (overdue.status, overdue.end_code, overdue.generation) == ("stopped", "deadline_exceeded", 0)


def test_an_ended_runs_attempt_that_no_worker_released_is_released_when_its_lease_lapses(alice: User) -> None:
    run = running_run(alice)
    services.run_cancel(run_id=run.pk, actor=alice)  # its worker is dead: nobody records the release
    assert services.runs_sweep(as_of=lease_of(run)).released == 0

    swept = services.runs_sweep(as_of=after_lease(run))

    assert swept.released == 1 and not swept.requeued
    attempt = RunAttempt.objects.get(run=run)
    assert (attempt.outcome, attempt.released_at) == (AttemptOutcome.LOST, attempt.lease_expires_at)
    assert services.runs_sweep(as_of=after_lease(run)).released == 0
    run.refresh_from_db()
    assert (run.status, run.lost_attempts) == ("cancelled", 0)  # an ended run counts no lost attempt

    # A worker that was only cut off, back in touch, says when it really stopped: earlier.
    later = attempt.released_at + timedelta(seconds=1)
    services.run_attempt_release(run_id=run.pk, generation=1, released_at=later)
    assert RunAttempt.objects.get(run=run).released_at == attempt.released_at
    earlier = attempt.released_at - timedelta(seconds=1)
    services.run_attempt_release(run_id=run.pk, generation=1, released_at=earlier)
    assert RunAttempt.objects.get(run=run).released_at == earlier
