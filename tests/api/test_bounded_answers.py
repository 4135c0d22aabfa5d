"""Every list and page bounded in bytes as well as rows: a list item carries a
run's big values only by name, and never reads them from the database; an events page stops at its
byte bound. (Streams, the Python client and the attack itself, against a web process:
tests/api/test_bounded_answers_live.py.)"""

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from runs import services
from runs.models import Run, RunEvent
from runs.selectors.wire import EVENT_ENVELOPE_BYTES
from runs.storable import json_bytes
from runs.transitions import FailCode
from tests.support.api import api_for
from tests.support.storage import big_events_run, events_pages

FIVE_MB = 5_000_000

# In process, on the test database: each within a minute.
pytestmark = pytest.mark.timeout(60)


def listed(api: APIClient, **query: Any) -> dict[str, dict[str, Any]]:
    response = api.get("/api/runs/", {"page_size": 500, **query})
    assert response.status_code == 200, response.content
    return {item["id"]: item for item in response.json()["results"]}


def finished(
    user: User, *, output: Any = None, error: Any = None, input: Any = None, worker: str = "test-worker"
) -> Run:
    """A run of `user` completed with `output`, or failed with `error`; nothing else queued."""
    run = services.run_create(owner=user, agent="demo", input=input or {"deltas": 1})
    claimed = services.run_claim(worker=worker)
    assert claimed is not None and claimed[0].pk == run.pk
    if error is None:
        return services.run_complete(run_id=run.pk, generation=claimed[0].generation, output=output)
    reason = "\x01" * 10_000  # the longest reason, each character escaped as six bytes in JSON
    return services.run_fail(
        run_id=run.pk, generation=claimed[0].generation, code=FailCode.AGENT_ERROR, reason=reason, error=error
    )


# --- the run list ----------------------------------------------------------------------------------


@pytest.mark.sqlite
@pytest.mark.django_db
@override_settings(RUNLEDGER_MAX_LIST_VALUE_BYTES=1000)
def test_a_list_item_leaves_out_values_over_the_bound_and_says_which_while_the_run_has_them_whole(
    alice: User,
) -> None:
    big_output = finished(alice, output={"text": "o" * 5000})
    big_error = finished(alice, error={"trace": "e" * 5000})
    long_reason = services.run_create(owner=alice, agent="demo", input={"deltas": 1})
    services.run_stop(run_id=long_reason.pk, actor=alice, reason="ü" * 600)  # 1,200 bytes of UTF-8
    big_input = services.run_create(owner=alice, agent="demo", input={"deltas": 1, "pad": "x" * 5000})
    small = services.run_create(owner=alice, agent="demo", input={"deltas": 1, "pad": "x" * 900})

    api = api_for(alice)
    items = listed(api)
    assert items[str(big_input.pk)]["input"] is None
    assert items[str(big_input.pk)]["truncated"] == ["input"]
    assert items[str(big_output.pk)]["output"] is None
    assert items[str(big_output.pk)]["truncated"] == ["output"]
    assert items[str(big_error.pk)]["error"] is None
    assert items[str(big_error.pk)]["end_reason"] == "\x01" * 250  # 1,000 bytes' worth of characters
    assert items[str(big_error.pk)]["truncated"] == ["error", "end_reason"]
    assert items[str(long_reason.pk)]["end_reason"] == "ü" * 250
    assert items[str(long_reason.pk)]["truncated"] == ["end_reason"]
    assert items[str(small.pk)]["input"] == {"deltas": 1, "pad": "x" * 900}
    assert items[str(small.pk)]["truncated"] == []
    assert items[str(big_output.pk)]["input"] == {"deltas": 1}

    # The run's own page has everything whole, and no `truncated`.
    whole = {run.pk: api.get(f"/api/runs/{run.pk}/").json() for run in (big_input, big_output, big_error, long_reason)}
    assert whole[big_input.pk]["input"] == {"deltas": 1, "pad": "x" * 5000}
    assert whole[big_output.pk]["output"] == {"text": "o" * 5000}
    assert whole[big_error.pk]["error"] == {"trace": "e" * 5000}
    assert whole[big_error.pk]["end_reason"] == "\x01" * 10_000
    assert whole[long_reason.pk]["end_reason"] == "ü" * 600
    assert all("truncated" not in run for run in whole.values())

    # 0 is unlimited, as for every limit.
    with override_settings(RUNLEDGER_MAX_LIST_VALUE_BYTES=0):
        items = listed(api)
    assert items[str(big_input.pk)]["input"] == {"deltas": 1, "pad": "x" * 5000}
    assert items[str(big_error.pk)]["end_reason"] == "\x01" * 10_000
    assert all(item["truncated"] == [] for item in items.values())


@pytest.mark.sqlite
@pytest.mark.django_db
def test_a_list_reads_a_value_from_the_database_only_when_its_stored_size_is_small(alice: User) -> None:
    services.run_create(owner=alice, agent="demo", input={"deltas": 1, "pad": "x" * 200_000})
    with CaptureQueriesContext(connection) as captured:
        assert listed(api_for(alice))
    runs = [q["sql"] for q in captured.captured_queries if 'FROM "runs_run"' in q["sql"] and "listed_input" in q["sql"]]
    assert len(runs) == 1
    for name in ("input", "output", "error"):
        column = f'"runs_run"."{name}"'
        # Only inside `CASE WHEN <name>_bytes <= bound THEN <name>`: the database never sends a big one.
        assert runs[0].count(column) == runs[0].count(f'WHEN "runs_run"."{name}_bytes" <= 1000 THEN {column}') == 1
    assert '"runs_run"."open_tool_calls"' not in runs[0]


@pytest.mark.sqlite
@pytest.mark.django_db
def test_the_worst_item_a_run_can_make_keeps_a_500_run_page_under_5_mb(make_user: Any) -> None:
    # The longest username, and worker name of the attempt; values just under the bound made of the
    # character JSON renderers escape to twice its bytes (U+2028, which DRF writes as \u2028).
    owner = make_user("u" * 150)
    input = {"p": "\u2028" * 330}
    assert json_bytes(input) <= 1000
    finished(owner, input=input, output={"p": "\u2028" * 330}, worker="w" * 200)
    finished(owner, input=input, error={"p": "\u2028" * 330}, worker="w" * 200)
    stopped = services.run_create(owner=owner, agent="demo", input=input)
    services.run_stop(run_id=stopped.pk, actor=owner, reason="!" + "\u2028" * 9_999)

    items = listed(api_for(owner))
    assert len(items) == 3
    for item in items.values():
        size = len(json.dumps(item, ensure_ascii=False, separators=(",", ":")).replace("\u2028", "\\u2028").encode())
        # An agent's name is up to 64 characters; the demo's is 4.
        assert size + 60 <= FIVE_MB // 500, (size, item["truncated"])


@pytest.mark.sqlite
@pytest.mark.django_db
def test_the_list_item_is_documented_with_what_it_may_leave_out() -> None:
    schema = APIClient().get("/api/schema/", {"format": "json"}).json()["components"]["schemas"]
    assert schema["RunPage"]["properties"]["results"]["items"]["$ref"].endswith("/RunListItem")
    truncated = schema["RunListItem"]["properties"]["truncated"]
    assert "read the run itself" in truncated["description"]
    enum = truncated["items"]["$ref"].rsplit("/", 1)[1]
    assert schema[enum]["enum"] == ["input", "output", "error", "end_reason"]
    assert schema["RunListItem"]["properties"]["input"]["nullable"] is True


# --- events pages ----------------------------------------------------------------------------------


def expected_pages(run: Run, bound: int) -> list[list[int]]:
    """The seqs of each page the rule makes: events while their data and envelopes fit in `bound`,
    one at least."""
    pages: list[list[int]] = [[]]
    total = 0
    for seq, size in RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", "data_bytes"):
        total += size + EVENT_ENVELOPE_BYTES
        if pages[-1] and total > bound:
            pages.append([])
            total = size + EVENT_ENVELOPE_BYTES
        pages[-1].append(seq)
    return pages


@pytest.mark.sqlite
@pytest.mark.django_db
@override_settings(RUNLEDGER_MAX_PAGE_BYTES=10_000)
def test_an_events_page_stops_at_the_byte_bound_and_next_after_seq_says_where(alice: User) -> None:
    # Small events, a run of 3 kB ones (three a page), one alone over the bound, then small again.
    run = big_events_run(alice, [10, 10, 3000, 3000, 3000, 3000, 3000, 20_000, 10, 10])
    pages = events_pages(api_for(alice), run, limit=1000)

    assert [[e["seq"] for e in page["results"]] for page in pages] == expected_pages(run, 10_000)
    # Each short of `limit`, yet more follow; the event over the bound comes alone.
    assert [len(page["results"]) for page in pages] == [6, 3, 1, 3]
    assert pages[2]["results"][0]["data"] == {"text": "y" * 20_000}
    assert [page["end_of_stream"] for page in pages] == [False] * 3 + [True]
    for page in pages:
        if len(page["results"]) > 1:
            assert page["bytes"] <= 10_000
    assert [e for page in pages for e in page["results"]] == [e.as_dict() for e in RunEvent.objects.filter(run=run)]

    # The row bound still holds, whichever comes first.
    first = api_for(alice).get(f"/api/runs/{run.pk}/events/", {"after_seq": 0, "limit": 2}).json()
    assert [e["seq"] for e in first["results"]] == [1, 2] and first["next_after_seq"] == 2
    # 0 is unlimited, as for every limit: rows alone bound the page.
    with override_settings(RUNLEDGER_MAX_PAGE_BYTES=0):
        whole = api_for(alice).get(f"/api/runs/{run.pk}/events/", {"after_seq": 0, "limit": 1000}).json()
    assert len(whole["results"]) == run.last_seq and whole["end_of_stream"]


@pytest.mark.sqlite
@pytest.mark.django_db
@override_settings(RUNLEDGER_MAX_PAGE_BYTES=10_000)
def test_events_stored_before_their_sizes_were_are_measured_when_read(alice: User) -> None:
    run = big_events_run(alice, [3000] * 8)
    RunEvent.objects.filter(run=run).update(data_bytes=None)  # as migration 0008 leaves older events
    pages = events_pages(api_for(alice), run, limit=1000)
    assert len(pages) >= 3
    assert all(page["bytes"] <= 10_000 for page in pages)
    assert [e for page in pages for e in page["results"]] == [e.as_dict() for e in RunEvent.objects.filter(run=run)]
