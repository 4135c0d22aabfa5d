"""The growth tiers' background rows (bench/run_all.py), written at a tiny size: a column added to
the models must not break them again, and what they write must be runs the app reads."""

from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from bench.rows import insert_select
from bench.scenarios import add_background
from runs.events import EventType
from runs.models import Run, RunAttempt, RunEvent
from tests.factories import assert_log_is_sound
from tests.support.db import token_for
from tests.support.procs import database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def test_background_rows_are_finished_runs_the_api_serves_whole() -> None:
    added = add_background(database_url(), runs=3, events_per_run=5)

    owner = User.objects.get(username="background")
    runs = list(Run.objects.filter(owner=owner))
    assert (added["added_runs"], added["total_runs"], added["total_events"]) == (3, 3, 15)
    assert len(runs) == 3
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_for(owner)}")
    for run in runs:
        run.full_clean()  # every field's value one the model accepts, the ones left to their defaults too
        assert run.status == "completed" and run.metadata == {}
        events = assert_log_is_sound(run)
        assert [e.type for e in events] == [
            EventType.RUN_CREATED,
            EventType.RUN_STARTED,
            EventType.OUTPUT_DELTA,
            EventType.OUTPUT_DELTA,
            EventType.RUN_COMPLETED,
        ]
        assert RunAttempt.objects.get(run=run).outcome == "completed"
        answer = client.get(f"/api/runs/{run.pk}/")
        assert answer.status_code == 200, answer.content
        assert answer.json()["status"] == "completed"
        page = client.get(f"/api/runs/{run.pk}/events/")
        assert page.status_code == 200, page.content
        assert [e["seq"] for e in page.json()["results"]] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    ("values", "refused"),
    [
        # seq is NOT NULL without a default: left out, it is named rather than guessed.
        ({"run_id": "id", "type": "'x'", "created_at": "now()"}, "RunEvent.seq"),
        # One default for every row would repeat a primary key.
        ({"owner_id": "1", "agent": "'demo'", "created_at": "now()", "updated_at": "now()"}, "Run.id"),
        ({"run_id": "id", "seq": "1", "type": "'x'", "created_at": "now()", "no_such": "1"}, "no_such"),
    ],
)
def test_a_column_the_insert_cannot_fill_is_named(values: dict[str, Any], refused: str) -> None:
    model = Run if "owner_id" in values else RunEvent
    with pytest.raises(ValueError, match=refused):
        insert_select(model, values, "FROM bg")
