"""What runs store and what answers carry of them: runs of big events, the figures the
database keeps (`Run.stored_bytes`, `RunEvent.data_bytes`) measured again from the rows themselves,
and the events pages of a run read to their end."""

import json
from typing import Any

from django.contrib.auth.models import User
from rest_framework.test import APIClient

from runs import services
from runs.events import EventType
from runs.models import Run, RunEvent
from runs.storable import json_bytes
from tests.factories import running_run


def measured_bytes(run: Run) -> int:
    """What the run stores, measured from its rows: input, each event's data, output and error."""
    run = Run.objects.get(pk=run.pk)
    events = sum(json_bytes(data) for data in RunEvent.objects.filter(run=run).values_list("data", flat=True))
    values = [value for value in (run.output, run.error) if value is not None]
    return json_bytes(run.input) + events + sum(json_bytes(value) for value in values)


def assert_sizes_stored(run: Run) -> None:
    """The run's stored sizes are what its rows measure, each event's and its own."""
    run = Run.objects.get(pk=run.pk)
    for event in RunEvent.objects.filter(run=run):
        assert event.data_bytes == json_bytes(event.data), event
    assert run.input_bytes == json_bytes(run.input)
    assert run.output_bytes == (0 if run.output is None else json_bytes(run.output))
    assert run.error_bytes == (0 if run.error is None else json_bytes(run.error))
    assert run.stored_bytes == measured_bytes(run)
    # Final once the run has ended, and what an owner's total sums of it then.
    assert run.ended_bytes == (run.stored_bytes if run.is_terminal else 0)


def events_pages(api: APIClient, run: Run, limit: int = 1000) -> list[dict[str, Any]]:
    """Every events page of the run from seq 0, following `next_after_seq` until `end_of_stream`;
    each page with its body's size (`bytes`)."""
    pages: list[dict[str, Any]] = []
    after = 0
    while True:
        response = api.get(f"/api/runs/{run.pk}/events/", {"after_seq": after, "limit": limit})
        assert response.status_code == 200, response.content
        page = {**json.loads(response.content), "bytes": len(response.content)}
        pages.append(page)
        assert page["results"], "a page of a run with events left holds one at least"
        assert page["next_after_seq"] == page["results"][-1]["seq"]
        if page["end_of_stream"]:
            return pages
        after = page["next_after_seq"]


def big_events_run(user: User, sizes: list[int]) -> Run:
    """A completed run with an `output.delta` event of each size (characters of text) in `sizes`."""
    run = running_run(user)
    events = [(EventType.OUTPUT_DELTA, {"text": "y" * size}) for size in sizes]
    services.run_events_append(run_id=run.pk, generation=run.generation, events=events)
    return services.run_complete(run_id=run.pk, generation=run.generation, output={"events": len(sizes)})
