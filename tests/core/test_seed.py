"""`manage.py seed_demo`: a demo dataset in every status, made through the services."""

from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from runs.models import Run, RunAttempt
from runs.transitions import Status
from tests.factories import assert_log_is_sound, queued_run

pytestmark = [pytest.mark.sqlite, pytest.mark.django_db]


def seed(*args: str) -> str:
    out = StringIO()
    call_command("seed_demo", "--long-events", "150", *args, stdout=out)
    return out.getvalue()


def test_seed_demo_makes_runs_in_every_status_with_sound_event_logs() -> None:
    output = seed()
    runs = list(Run.objects.all())
    assert {run.status for run in runs} == {status.value for status in Status}
    for run in runs:
        events = assert_log_is_sound(run)
        assert events, run
        assert str(run.pk) in output  # it says what it made
    assert Run.objects.filter(parent__isnull=False).exists()
    assert Run.objects.filter(end_code="parent_cancelled").exists()
    assert Run.objects.filter(last_seq__gte=150).exists()  # a timeline longer than a page
    assert RunAttempt.objects.filter(released_at__isnull=False, outcome="cancelled").exists()
    assert {run.owner.username for run in runs} == {"demo"}


def test_seed_demo_can_run_again_and_cancels_what_it_left_queued() -> None:
    seed()
    left_queued = set(Run.objects.filter(status="queued").values_list("pk", flat=True))
    output = seed()
    assert "left queued by an earlier seed" in output
    assert set(Run.objects.filter(pk__in=left_queued).values_list("status", flat=True)) == {"cancelled"}
    assert Run.objects.filter(status="queued").count() == len(left_queued)  # the new seed's own


def test_seed_demo_refuses_to_take_other_users_queued_runs(alice: User) -> None:
    theirs = queued_run(alice)
    with pytest.raises(CommandError, match="queued runs of other users"):
        seed()
    theirs.refresh_from_db()
    assert theirs.status == "queued" and theirs.last_seq == 1
    assert not Run.objects.exclude(pk=theirs.pk).exists()


def test_seed_demo_owner_option(alice: User) -> None:
    seed("--owner", "alice")
    assert set(Run.objects.values_list("owner__username", flat=True)) == {"alice"}
