"""The database's clock as the processes read it (runs.selectors.clock, docs/design/execution.md#leases)."""

import pytest
from django.contrib.auth.models import User

from runs.models import Run
from runs.selectors.clock import db_now
from runs.services.quotas import DUE
from runs.services.ranking import DbNow
from tests.factories import queued_run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.sqlite
def test_a_start_after_set_from_the_processes_clock_is_due_by_the_claims_clock_at_once(alice: User) -> None:
    """runs.selectors.clock.db_now against the clock the claims' due check reads (SQLite's to the
    millisecond, its times compared as text): never a moment ahead of it."""
    one = Run.objects.filter(pk=queued_run(alice).pk)
    for _ in range(300):
        taken = db_now()
        one.update(start_after=taken)
        assert one.filter(DUE).exists()
        assert taken <= one.annotate(clock=DbNow()).values_list("clock", flat=True).get()
