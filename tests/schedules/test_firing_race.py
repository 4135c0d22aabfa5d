"""Threads racing to fire the same schedules, each on its own connection (PostgreSQL: SQLite writes
one transaction at a time, so nothing races there): one run per due time, every due time fired."""

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User

from runs.models import Run
from runs.services.firing import schedules_fire
from tests.schedules.test_firing import MINUTE, due_again, every_minute, rewind
from tests.support.threads import race


@pytest.fixture(autouse=True)
def _short_schedules(settings: Any) -> None:
    settings.RUNLEDGER_MIN_SCHEDULE_SECONDS = 1


@pytest.mark.django_db(transaction=True)
def test_threads_racing_to_fire_the_same_schedules_create_one_run_per_due_time(alice: User) -> None:
    schedules = [rewind(every_minute(alice, overlap="allow_all"), 2 * MINUTE + timedelta(seconds=1)) for _ in range(30)]
    for _ in range(3):
        results = race(6, lambda i: schedules_fire(limit=1000))
        assert all(isinstance(result, int) for result in results), results
        assert sum(results) == len(schedules)
        for schedule in schedules:
            due_again(schedule)
    per_due = Counter(Run.objects.filter(schedule__in=schedules).values_list("schedule_id", "schedule_due_at"))
    assert len(per_due) == 3 * len(schedules) and set(per_due.values()) == {1}
