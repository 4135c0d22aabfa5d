"""Reading through the API (docs/design/api.md#lists, #paging): a run with its current attempt, lists by
cursor and filter in constant queries, events pages to the end of the stream, and the public schema,
docs and health probes."""

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from runs import services
from runs.models import RunEvent
from tests.factories import queued_run, running_run
from tests.support.api import assert_error, url

pytestmark = pytest.mark.sqlite

# --- read -----------------------------------------------------------------------------------


def test_a_running_run_shows_its_current_attempt(api: APIClient, alice: User) -> None:
    run = running_run(alice)
    body = api.get(url(run)).json()
    assert body["status"] == "running" and body["started_at"] is not None
    attempt = body["attempt"]
    assert set(attempt) == {
        "generation",
        "worker",
        "claimed_at",
        "heartbeat_at",
        "lease_expires_at",
        "released_at",
        "outcome",
    }
    assert (attempt["generation"], attempt["worker"], attempt["released_at"], attempt["outcome"]) == (
        1,
        "test-worker",
        None,
        None,
    )
    services.run_cancel(run_id=run.pk, actor=alice)
    assert api.get(url(run)).json()["attempt"]["outcome"] == "cancelled"


def test_list_pages_by_cursor_newest_first(api: APIClient, alice: User, bob: User) -> None:
    mine = [queued_run(alice) for _ in range(5)]
    queued_run(bob)
    body = api.get("/api/runs/", {"page_size": 2}).json()
    assert set(body) == {"next", "previous", "results"}
    assert body["previous"] is None and "cursor=" in body["next"]
    assert [r["id"] for r in body["results"]] == [str(r.pk) for r in reversed(mine[-2:])]
    second = api.get(body["next"]).json()
    last = api.get(second["next"]).json()
    assert last["next"] is None and [r["id"] for r in last["results"]] == [str(mine[0].pk)]


def test_list_reads_the_current_attempts_in_constant_queries(
    api: APIClient, alice: User, django_assert_max_num_queries: Any
) -> None:
    running_run(alice)
    api.get("/api/agents/")  # the token's first use is noted (then once a minute): not counted below
    with django_assert_max_num_queries(10) as small:
        api.get("/api/runs/")
    few = len(small.captured_queries)
    for _ in range(6):
        running_run(alice)
    with django_assert_max_num_queries(few) as large:
        body = api.get("/api/runs/").json()
    assert len(large.captured_queries) == few
    assert all(r["attempt"] is not None for r in body["results"])


def test_list_filters_by_status_agent_parent_and_creation_time(api: APIClient, alice: User) -> None:
    running = running_run(alice)
    parent = queued_run(alice)
    child = queued_run(alice, parent_id=parent.pk)
    ids = lambda **q: {r["id"] for r in api.get("/api/runs/", q).json()["results"]}  # noqa: E731
    assert ids(status="running") == {str(running.pk)}
    assert ids(status="queued") == {str(parent.pk), str(child.pk)}
    assert ids(agent="demo") == {str(parent.pk), str(child.pk), str(running.pk)}
    assert ids(agent="other") == set()
    assert ids(parent=str(parent.pk)) == {str(child.pk)}
    assert ids(created_after=parent.created_at.isoformat()) == {str(parent.pk), str(child.pk)}
    assert ids(created_before=parent.created_at.isoformat()) == {str(running.pk)}


@pytest.mark.parametrize(
    "query",
    [
        {"status": "bogus"},
        {"parent": "not-a-uuid"},
        {"created_after": "yesterday"},
        {"created_before": "2024-13-45T00:00:00Z"},
        {"page_size": "0"},
        {"page_size": "ten"},
        {"cursor": "1"},
        {"status": "queued,bogus"},
        {"end_code": "bogus"},
        {"agent": "x" * 65},
        {"agent": "a\x00b"},
    ],
)
def test_malformed_list_filters_are_400(api: APIClient, alice: User, query: dict[str, str]) -> None:
    queued_run(alice)
    body = assert_error(api.get("/api/runs/", query), 400, "validation_error")
    assert set(query) <= set(body["error"]["detail"])


# --- events ---------------------------------------------------------------------------------


def test_events_page_follows_the_cursor_to_the_end_of_the_stream(api: APIClient, alice: User) -> None:
    run = running_run(alice)
    services.run_events_append(
        run_id=run.pk, generation=1, events=[("output.delta", {"text": str(i)}) for i in range(5)]
    )
    first = api.get(url(run, "events"), {"limit": 3}).json()
    assert set(first) == {"results", "next_after_seq", "last_seq", "run_status", "end_of_stream"}
    assert [e["seq"] for e in first["results"]] == [1, 2, 3]
    assert (first["next_after_seq"], first["last_seq"], first["run_status"], first["end_of_stream"]) == (
        3,
        7,
        "running",
        False,
    )
    stored = {e.seq: e.as_dict() for e in RunEvent.objects.filter(run=run)}
    assert first["results"] == [stored[1], stored[2], stored[3]]  # the same object as SSE data
    rest = api.get(url(run, "events"), {"after_seq": 3}).json()
    assert [e["seq"] for e in rest["results"]] == [4, 5, 6, 7] and rest["end_of_stream"] is False
    services.run_complete(run_id=run.pk, generation=1, output={"text": "done"})
    tail = api.get(url(run, "events"), {"after_seq": 7}).json()
    assert [e["type"] for e in tail["results"]] == ["run.completed"]
    assert (tail["next_after_seq"], tail["last_seq"], tail["run_status"], tail["end_of_stream"]) == (
        8,
        8,
        "completed",
        True,
    )
    empty = api.get(url(run, "events"), {"after_seq": 8}).json()
    assert empty["results"] == [] and empty["next_after_seq"] == 8 and empty["end_of_stream"] is True


def test_a_terminal_run_page_short_of_its_last_event_is_not_the_end(api: APIClient, alice: User) -> None:
    run = queued_run(alice)
    services.run_cancel(run_id=run.pk, actor=alice)
    page = api.get(url(run, "events"), {"limit": 1}).json()
    assert page["run_status"] == "cancelled" and page["next_after_seq"] == 1 and page["end_of_stream"] is False


@pytest.mark.parametrize(
    "query",
    [
        {"limit": "1001"},
        {"limit": "0"},
        {"limit": "many"},
        {"after_seq": "-1"},
        {"after_seq": "abc"},
        {"after_seq": "1.0"},
        {"after_seq": " 1"},
        {"after_seq": "2"},
        {"after_seq": "99999999999999999999999"},
    ],
)
def test_malformed_or_out_of_range_event_cursors_are_400(api: APIClient, alice: User, query: dict[str, str]) -> None:
    run = queued_run(alice)  # last_seq 1
    assert_error(api.get(url(run, "events"), query), 400, "validation_error")


def test_events_limit_of_1000_is_allowed(api: APIClient, alice: User) -> None:
    run = queued_run(alice)
    assert api.get(url(run, "events"), {"limit": 1000, "after_seq": 1}).status_code == 200


# --- schema and docs ------------------------------------------------------------------------


def test_the_schema_and_docs_are_public_and_document_every_error() -> None:
    anonymous = Client()
    response = anonymous.get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    schema = json.loads(response.content)
    paths = schema["paths"]
    expected = {
        ("/api/runs/", "get"): {"200", "400", "401", "503"},
        ("/api/runs/", "post"): {"201", "400", "401", "409", "413", "415", "422", "429", "503"},
        ("/api/runs/{run_id}/", "get"): {"200", "401", "404", "503"},
        ("/api/runs/{run_id}/events/", "get"): {"200", "400", "401", "404", "503"},
        ("/api/runs/{run_id}/cancel/", "post"): {"200", "400", "401", "403", "404", "409", "413", "415", "503"},
        ("/api/runs/{run_id}/stop/", "post"): {"200", "400", "401", "403", "404", "409", "413", "415", "503"},
        ("/api/runs/{run_id}/pause/", "post"): {"200", "202", "401", "403", "404", "409", "503"},
        ("/api/runs/{run_id}/resume/", "post"): {"200", "400", "401", "403", "404", "409", "413", "415", "429", "503"},
    }
    for (path, method), codes in expected.items():
        documented = paths[path][method]["responses"]
        assert set(documented) == codes, (path, method)
        for code in codes - {"200", "201", "202"}:
            ref = documented[code]["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith("/Conflict" if code == "409" else "/Error")
    assert set(schema["components"]["schemas"]["Error"]["properties"]) == {"error"}
    # What is used of each budget, beside the budget; and the 409 that a full budget answers.
    run_schema = schema["components"]["schemas"]["RunOutput"]
    assert {"steps_used", "events_used", "max_steps", "max_events"} <= set(run_schema["required"])
    assert run_schema["properties"]["events_used"]["type"] == "integer"
    assert "budget_exhausted" in paths["/api/runs/{run_id}/resume/"]["post"]["responses"]["409"]["description"]
    assert {"tokenAuth", "cookieAuth"} <= set(schema["components"]["securitySchemes"])
    # Credentials are not needed, and bad ones are ignored rather than refused.
    assert anonymous.get("/api/schema/", HTTP_AUTHORIZATION="Token nonsense").status_code == 200
    docs = anonymous.get("/api/docs/")
    assert docs.status_code == 200 and b"/api/schema/" in docs.content


def test_health_probes_are_public_json(db: None) -> None:
    for path in ("/healthz/", "/readyz/"):
        response = Client().get(path)
        assert response.status_code == 200 and response.json()["status"] == "ok"
