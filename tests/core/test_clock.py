"""The database's clock as the processes read it (runs.selectors.clock, docs/design/execution.md#leases)."""

import pytest
from django.contrib.auth.models import User
from django.db.models.functions import Now

from runs.models import Run
from runs.selectors.clock import db_now
from tests.factories import queued_run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.sqlite
def test_the_clock_a_command_reads_is_never_ahead_of_the_one_the_claims_compare_with(alice: User) -> None:
    """runs.selectors.clock.db_now against SQL's own clock (Now(), as the claims' due check reads
    it; SQLite's to the millisecond): a start_after set from the first is due by the second at once."""
    one = Run.objects.filter(pk=queued_run(alice).pk)
    for _ in range(300):
        taken = db_now()
        assert taken <= one.annotate(clock=Now()).values_list("clock", flat=True).get()
