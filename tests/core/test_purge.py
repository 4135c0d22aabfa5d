"""Retention: `runs_purge` and `manage.py purge_runs` delete old terminal runs, never live ones."""

from collections.abc import Callable
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs import services
from runs.exceptions import ValidationFailed
from runs.management.commands.purge_runs import parse_age
from runs.models import AuthFailure, IdempotencyRecord, Run, RunAttempt, RunEvent
from tests.factories import queued_run, running_run, waiting_run

pytestmark = [pytest.mark.sqlite, pytest.mark.django_db]


def ended_runs(owner: User) -> list[Run]:
    """One run of each terminal status, with events and attempts; a cancelled parent and its child."""
    completed = running_run(owner)
    services.run_events_append(
        run_id=completed.pk, generation=completed.generation, events=[("output.delta", {"text": "a"})] * 3
    )
    services.run_complete(run_id=completed.pk, generation=completed.generation, output={})
    failed = running_run(owner)
    services.run_fail(run_id=failed.pk, generation=failed.generation, code="agent_error", reason="boom")
    stopped = waiting_run(owner)
    services.run_stop(run_id=stopped.pk, actor=None, code="policy", reason="old")
    parent = running_run(owner)
    child = queued_run(owner, parent_id=parent.pk)
    services.run_cancel(run_id=parent.pk, actor=owner, note="")  # the child ends with it
    return [completed, failed, stopped, parent, child]


def live_runs(owner: User) -> list[Run]:
    """Running and waiting runs, one of them a child. (Queued ones are made by each test last: a
    claim takes the oldest queued run, so none may wait while the factories claim theirs.)"""
    parent = running_run(owner)
    return [parent, running_run(owner, parent_id=parent.pk), waiting_run(owner)]


def queued_runs(owner: User, parent: Run) -> list[Run]:
    return [queued_run(owner), queued_run(owner, parent_id=parent.pk)]


def ids(runs: list[Run]) -> set[object]:
    return {run.pk for run in runs}


def test_purge_deletes_old_terminal_runs_with_their_events_and_attempts_and_keeps_live_and_recent_ones(
    alice: User,
) -> None:
    live_before = live_runs(alice)  # live runs older than the cutoff are kept all the same
    old = ended_runs(alice)
    cutoff = timezone.now()
    recent = ended_runs(alice)
    live_after = live_runs(alice) + queued_runs(alice, parent=live_before[0])
    old_events = RunEvent.objects.filter(run__in=ids(old)).count()
    old_attempts = RunAttempt.objects.filter(run__in=ids(old)).count()

    result = services.runs_purge(ended_before=cutoff, batch_size=2)

    assert (result.runs, result.events, result.attempts) == (len(old), old_events, old_attempts)
    assert set(Run.objects.values_list("pk", flat=True)) == ids(live_before + recent + live_after)
    assert not RunEvent.objects.filter(run_id__in=ids(old)).exists()
    assert not RunAttempt.objects.filter(run_id__in=ids(old)).exists()
    # Five runs, two a batch: three batches, or two when the child goes in its parent's cascade.
    assert result.batches in (2, 3)


def test_a_dry_run_deletes_nothing_and_counts_what_a_real_run_deletes(alice: User) -> None:
    old = ended_runs(alice)
    queued_runs(alice, parent=live_runs(alice)[0])
    cutoff = timezone.now()
    before = (Run.objects.count(), RunEvent.objects.count(), RunAttempt.objects.count())

    dry = services.runs_purge(ended_before=cutoff, dry_run=True)

    assert (Run.objects.count(), RunEvent.objects.count(), RunAttempt.objects.count()) == before
    real = services.runs_purge(ended_before=cutoff)
    assert (dry.runs, dry.events, dry.attempts) == (real.runs, real.events, real.attempts)
    assert dry.runs == len(old)


def test_a_run_goes_only_with_its_whole_subtree(alice: User) -> None:
    parent = running_run(alice)
    child = running_run(alice, parent_id=parent.pk)
    grandchild = queued_run(alice, parent_id=child.pk)
    services.run_complete(run_id=parent.pk, generation=parent.generation, output={})  # the others end with it
    cutoff = timezone.now()
    # A descendant that ended after the cutoff although its ancestor ended before can only come
    # from clocks that disagree between machines; time cannot be moved, so the row is edited.
    Run.objects.filter(pk=grandchild.pk).update(ended_at=cutoff + timedelta(seconds=1))

    result = services.runs_purge(ended_before=cutoff)

    assert result.runs == 0  # deleting the parent or the child would take the grandchild with it
    assert Run.objects.filter(pk__in=[parent.pk, child.pk, grandchild.pk]).count() == 3
    assert services.runs_purge(ended_before=cutoff + timedelta(seconds=2)).runs == 3


def test_purge_refuses_a_batch_size_below_one() -> None:
    with pytest.raises(ValidationFailed):
        services.runs_purge(ended_before=timezone.now(), batch_size=0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30d", timedelta(days=30)),
        ("12h", timedelta(hours=12)),
        ("90m", timedelta(minutes=90)),
        ("45s", timedelta(seconds=45)),
        ("2w", timedelta(weeks=2)),
        ("0s", timedelta(0)),
    ],
)
def test_ages_are_a_number_and_a_unit(text: str, expected: timedelta) -> None:
    assert parse_age(text) == expected


def run_command(*args: str) -> str:
    out = StringIO()
    call_command("purge_runs", *args, stdout=out)
    return out.getvalue()


def test_the_command_dry_run_says_what_it_would_delete(make_user: Callable[..., User]) -> None:
    owner = make_user()
    old = ended_runs(owner)
    live = live_runs(owner)
    live += queued_runs(owner, parent=live[0])
    output = run_command("--older-than", "0s", "--dry-run")
    assert f"would delete {len(old)} terminal runs" in output
    assert Run.objects.count() == len(old) + len(live)

    output = run_command("--older-than", "0s", "--batch-size", "2", "--yes")
    assert f"Deleted {len(old)} terminal runs" in output
    assert set(Run.objects.values_list("pk", flat=True)) == ids(live)


def test_the_command_keeps_runs_younger_than_the_retention_age(alice: User) -> None:
    ended_runs(alice)
    before = Run.objects.count()
    assert "Deleted 0 terminal runs" in run_command("--older-than", "30d")
    assert Run.objects.count() == before


@pytest.mark.parametrize("bad", [["--older-than", "30"], ["--older-than", "ten days"], ["--older-than", "-1d"]])
def test_the_command_refuses_an_unreadable_age(bad: list[str]) -> None:
    with pytest.raises(CommandError):
        run_command(*bad)


def test_the_command_needs_an_age() -> None:
    with pytest.raises(CommandError):
        run_command()


def test_an_age_below_a_day_needs_yes_and_deletes_nothing_without_it(alice: User) -> None:
    old = ended_runs(alice)
    with pytest.raises(CommandError, match="--yes"):
        run_command("--older-than", "12h")
    assert Run.objects.count() == len(old)
    assert "Dry run: would delete 0 terminal runs" in run_command("--older-than", "12h", "--dry-run")
    assert f"Deleted {len(old)} terminal runs" in run_command("--older-than", "0s", "--yes")


def test_a_long_history_goes_a_bounded_number_of_events_per_transaction(alice: User) -> None:
    run = running_run(alice)
    deltas = [("output.delta", {"text": "x"})] * 24
    services.run_events_append(run_id=run.pk, generation=run.generation, events=deltas)
    services.run_complete(run_id=run.pk, generation=run.generation, output={})
    stored = RunEvent.objects.filter(run=run).count()  # created, started, 24 deltas, completed
    with CaptureQueriesContext(connection) as captured:
        result = services.runs_purge(ended_before=timezone.now() + timedelta(seconds=1), events_per_transaction=10)
    deletes = [
        q["sql"]
        for q in captured.captured_queries
        if 'DELETE FROM "runs_runevent" WHERE "runs_runevent"."id"' in q["sql"]
    ]
    assert (result.runs, result.events) == (1, stored)
    assert len(deletes) == -(-stored // 10)  # ten at most in each
    assert not Run.objects.filter(pk=run.pk).exists()


def test_purge_deletes_idempotency_records_past_their_ttl_and_keeps_fresh_ones(alice: User) -> None:
    now = timezone.now()
    expired = IdempotencyRecord.objects.create(
        user=alice, key="old", request_body={"a": 1}, created_at=now - timedelta(days=2)
    )
    fresh = IdempotencyRecord.objects.create(user=alice, key="new", request_body={"a": 1}, created_at=now)
    result = services.runs_purge(ended_before=now - timedelta(days=30))
    assert result.idempotency_records == 1
    assert list(IdempotencyRecord.objects.values_list("pk", flat=True)) == [fresh.pk]
    assert not IdempotencyRecord.objects.filter(pk=expired.pk).exists()


def test_purge_deletes_failed_authentications_past_their_window_and_keeps_fresh_ones() -> None:
    now = timezone.now()
    stale = AuthFailure.objects.bulk_create(
        [AuthFailure(key=f"{i:064x}", failed_at=now - timedelta(seconds=301 + i)) for i in range(3)]
    )
    fresh = AuthFailure.objects.create(key="f" * 64, failed_at=now - timedelta(seconds=299))
    result = services.runs_purge(ended_before=now - timedelta(days=30))
    assert result.auth_failures == 3
    # Only these rows are looked at: a server of another test may have counted failures of its own.
    assert not AuthFailure.objects.filter(pk__in=[row.pk for row in stale]).exists()
    assert AuthFailure.objects.filter(pk=fresh.pk).exists()
    out = StringIO()
    call_command("purge_runs", "--older-than", "30d", stdout=out)
    assert "0 failed sign-ins and token attempts past their window" in out.getvalue()
