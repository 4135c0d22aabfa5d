"""The statements each hot endpoint sends: authentication (the token with its address's
throttle standing, one statement), the locked transaction and the response — no read before the
transaction, none of the run again after it. And the worker's claim, the middle of the start path.

Counted on PostgreSQL (this file is not in the SQLite selection), where `BEGIN`/`COMMIT` and the
notifications are statements of their own."""

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from runs import services
from runs.models import PRIORITY_MAX
from runs.services.webhook_endpoints import webhook_create
from tests.factories import queued_run, running_run
from tests.support.db import token_for

pytestmark = pytest.mark.django_db(transaction=True)


def statements(call: Callable[[], Any], status: int) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        response = call()
    assert response.status_code == status, response.content
    return _kinds(captured)


def _kinds(captured: CaptureQueriesContext) -> list[str]:
    """Each round trip as its statements' first words and the tables they are about; statements sent
    together (runs.services.statements) joined by "; "."""
    return ["; ".join(_kind(sql) for sql in q["sql"].split(";\n")) for q in captured.captured_queries]


def _kind(sql: str) -> str:
    return sql.lstrip().split(" ", 1)[0] + " " + _table(sql)


def _table(sql: str) -> str:
    for word in (
        "runs_apitoken",
        "runs_webhooknotification",
        "runs_webhookdelivery",
        "runs_runevent",
        "runs_runattempt",
        "runs_authfailure",
        "runs_webhookendpoint",
        "runs_run",
        "auth_user",
        "pg_notify",
    ):
        if word in sql:
            return word
    return ""


def url(run: Any, action: str = "") -> str:
    return f"/api/runs/{run.pk}/" + (f"{action}/" if action else "")


@pytest.fixture
def api(alice: User) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_for(alice)}")
    # A token's first use notes it (then at most once a minute): here, not in the requests counted.
    assert client.get("/api/agents/").status_code == 200
    return client


def test_a_cancel_is_authentication_one_locked_transaction_and_the_attempt_it_answers(
    api: APIClient, alice: User
) -> None:
    running, queued = running_run(alice), queued_run(alice)
    assert statements(lambda: api.post(url(queued, "cancel"), {}), 200) == [
        # The key, its user and its address's standing (blocked?), one statement (docs/design/fair-use.md)
        "SELECT runs_apitoken",
        "BEGIN ",
        "SELECT runs_run",  # FOR NO KEY UPDATE, the owner joined: visibility, permission, transition
        "INSERT runs_runevent",
        "SELECT pg_notify",  # events and control, one statement
        "SELECT runs_webhookendpoint",  # any endpoint to notify? one index read (docs/design/webhooks.md#outbox)
        "UPDATE runs_run",  # after it: a notification's body counts in the run's stored bytes
        "SELECT runs_run",  # the unfinished children the cancel cascades to
        "COMMIT ",
    ]
    assert statements(lambda: api.post(url(running, "cancel"), {}), 200) == [
        "SELECT runs_apitoken",
        "BEGIN ",
        "SELECT runs_run",
        "INSERT runs_runevent",
        "SELECT pg_notify",
        "UPDATE runs_runattempt",
        "SELECT runs_webhookendpoint",
        "UPDATE runs_run",
        "SELECT runs_run",
        "COMMIT ",
        "SELECT runs_runattempt",  # the answer shows the attempt
    ]


def test_a_create_and_a_read_send_no_statement_beyond_their_work(api: APIClient, alice: User) -> None:
    assert statements(lambda: api.post("/api/runs/", {"agent": "demo", "input": {}}), 201) == [
        "SELECT runs_apitoken",
        "BEGIN ",
        "SELECT ",  # pg_advisory_xact_lock: the owner's creates, one at a time ...
        "SELECT runs_run",  # ... so their totals (active, kept, bytes) are the caps' truth
        "INSERT runs_runevent",
        "SELECT pg_notify",  # events and queue, one statement
        "INSERT runs_run",  # with its last_seq: no second write of the row
        "COMMIT ",
    ]
    run = queued_run(alice)
    assert statements(lambda: api.get(url(run)), 200) == [
        "SELECT runs_apitoken",
        "SELECT runs_run",
    ]


def test_a_refused_body_is_checked_against_the_run_first(api: APIClient, alice: User, bob: User) -> None:
    """The command reads the run only under its lock — but a refused body still answers in the
    order of docs/design/api.md#check-order: an invisible run is a 404 whatever the body, a visible
    one a 400."""
    mine, theirs = queued_run(alice), queued_run(bob)
    assert api.post(url(theirs, "cancel"), {"note": ["not a string"]}).status_code == 404
    assert api.post(url(theirs, "cancel"), "{not json", content_type="application/json").status_code == 404
    assert api.post(url(mine, "cancel"), {"note": ["not a string"]}).status_code == 400
    assert api.post(url(mine, "stop"), {"code": "nope"}).status_code == 403  # no runs.stop_run: before the body
    mine.refresh_from_db()
    assert mine.status == "queued"


def test_a_list_page_reads_its_rows_and_their_attempts_and_counts_nothing(api: APIClient, alice: User) -> None:
    """A page is one keyset read (a row more than the page, to know whether more follow) and the
    page's current attempts: no COUNT of the table, on the first page or any after it."""
    for _ in range(3):
        running_run(alice)
    for _ in range(3):
        queued_run(alice, metadata={"customer": "42"})
    first: list[Any] = []

    def page(query: dict[str, Any]) -> Any:
        response = api.get("/api/runs/", query)
        first.append(response)
        return response

    expected = [
        "SELECT runs_apitoken",
        "SELECT auth_user",  # does the caller see every run? its own permissions ...
        "SELECT auth_user",  # ... and its groups' (docs/design/api.md#access)
        "SELECT runs_run",  # the page and one row more, the owner joined
        "SELECT runs_runattempt",  # the page's current attempts, one query for all
    ]
    assert statements(lambda: page({"page_size": 2, "status": "queued,running"}), 200) == expected
    assert statements(lambda: api.get(first[0].json()["next"]), 200) == expected
    assert statements(lambda: page({"metadata.customer": "42", "page_size": 2}), 200) == expected
    queries = [q["sql"] for q in _captured(lambda: api.get(first[1].json()["next"]))]
    assert not any("COUNT(" in sql.upper() for sql in queries)


def _captured(call: Callable[[], Any]) -> list[dict[str, Any]]:
    with CaptureQueriesContext(connection) as captured:
        assert call().status_code == 200
    return list(captured.captured_queries)


# Pinned as they are, so that none creeps in: the later work lowers them.


def test_healthz_sends_no_statement() -> None:
    """The probe is the floor the API's figures are compared with (docs/benchmarks.md): no database."""
    assert statements(lambda: Client().get("/healthz/"), 200) == []


def test_a_create_scheduled_ahead_sends_the_statements_of_any_create(api: APIClient) -> None:
    ahead = (timezone.now() + timedelta(hours=1)).isoformat()
    body = {"agent": "demo", "input": {"deltas": 1}, "start_after": ahead}
    assert statements(lambda: api.post("/api/runs/", body, format="json"), 201) == [
        "SELECT runs_apitoken",
        "BEGIN ",
        "SELECT ",  # the owner's lock: a run scheduled ahead counts against the caps like any
        "SELECT runs_run",
        "INSERT runs_runevent",
        "SELECT pg_notify",  # events and queue: the workers wake and find nothing due yet
        "INSERT runs_run",
        "COMMIT ",
    ]


def test_a_read_adds_the_attempt_of_a_claimed_run_and_the_partial_output_of_an_ended_one(
    api: APIClient, alice: User
) -> None:
    running = running_run(alice)
    assert statements(lambda: api.get(url(running)), 200) == [
        "SELECT runs_apitoken",
        "SELECT runs_run",
        "SELECT runs_runattempt",  # its current attempt, a statement of its own
    ]
    services.run_events_append(
        run_id=running.pk, generation=running.generation, events=[("output.delta", {"text": "half"})]
    )
    services.run_cancel(run_id=running.pk, actor=alice)
    assert statements(lambda: api.get(url(running)), 200) == [
        "SELECT runs_apitoken",
        "SELECT runs_run",
        "SELECT runs_runevent",  # the partial output, one aggregate (docs/design/execution.md#partial-output)
        "SELECT runs_runattempt",
    ]


def test_a_cancel_with_a_webhook_endpoint_adds_the_outbox_writes(api: APIClient, alice: User) -> None:
    without = statements(lambda: api.post(url(running_run(alice), "cancel"), {}), 200)
    webhook_create(owner=alice, url="https://hooks.example.test/in", events=["run.cancelled"])
    looked_up = without.index("SELECT runs_webhookendpoint") + 1
    assert (
        statements(lambda: api.post(url(running_run(alice), "cancel"), {}), 200)
        == [
            *without[:looked_up],
            "SELECT runs_runattempt",  # the notification's body: the run's JSON with its attempt, read again after
            "INSERT runs_webhooknotification",
            "INSERT runs_webhookdelivery",
            "SELECT pg_notify",  # webhooks due: a second notification statement
            *without[looked_up:],
        ]
    )


def test_a_page_of_events_reads_the_run_and_its_events(api: APIClient, alice: User) -> None:
    run = queued_run(alice)
    assert statements(lambda: api.get(url(run, "events")), 200) == [
        "SELECT runs_apitoken",
        "SELECT runs_run",  # its agent and last_seq
        "WITH runs_runevent",  # the page and the run's state, one statement (runs.selectors.wire)
    ]


def test_a_claim_is_one_transaction_that_opens_the_attempt_and_writes_run_started(alice: User) -> None:
    """The start path's middle (docs/design/execution.md#claims): what a worker sends between a
    create's notification and the watcher's `run.started` — five round trips."""
    queued_run(alice)
    with CaptureQueriesContext(connection) as captured:
        assert services.run_claim(worker="w") is not None
    assert _kinds(captured) == [
        # The owners in fair-share order, and whether a run that jumps fair share is queued at all
        # (runs.services.quotas): none is, so no statement looks for one. Before the transaction:
        # a claim that finds nothing sends this alone.
        "WITH runs_run",
        "BEGIN ",
        "SELECT runs_run",  # that owner's first claimable run, locked, with the database's clock
        # The attempt, run.started, its notification and the run: one round trip (runs.services.statements).
        "INSERT runs_runattempt; INSERT runs_runevent; SELECT pg_notify; UPDATE runs_run",
        "COMMIT ",
    ]


def test_a_claim_looks_for_a_run_that_jumps_fair_share_only_when_one_is_queued(
    alice: User, make_user: Callable[..., User]
) -> None:
    """docs/design/fair-use.md#priority: above PRIORITY_MAX a run goes before any fair-share pick."""
    queued_run(alice)
    urgent = queued_run(make_user("staff", perms=("runs.prioritize_run",)), priority=PRIORITY_MAX + 1)
    with CaptureQueriesContext(connection) as captured:
        claimed = services.run_claim(worker="w")
    assert claimed is not None and claimed[0].pk == urgent.pk
    assert _kinds(captured) == [
        "WITH runs_run",
        "BEGIN ",
        "SELECT runs_run",  # the urgent run, locked, with the clock: no fair-share pick after it
        "INSERT runs_runattempt; INSERT runs_runevent; SELECT pg_notify; UPDATE runs_run",
        "COMMIT ",
    ]
    with CaptureQueriesContext(connection) as captured:
        assert services.run_claim(worker="w") is not None  # alice's, by fair share
    assert _kinds(captured)[:3] == ["WITH runs_run", "BEGIN ", "SELECT runs_run"]
    with CaptureQueriesContext(connection) as captured:
        assert services.run_claim(worker="w") is None
    assert _kinds(captured) == ["WITH runs_run"]  # nothing to take: one statement, no transaction


@override_settings(RUNLEDGER_MAX_RUNNING_PER_USER=2)
def test_a_claim_under_a_running_cap_takes_the_claims_lock_with_the_ranking(alice: User) -> None:
    """docs/design/fair-use.md#fair-claiming: the lock and the ranking read after it, one round trip,
    in the transaction."""
    queued_run(alice)
    with CaptureQueriesContext(connection) as captured:
        assert services.run_claim(worker="w") is not None
    assert _kinds(captured)[:3] == ["BEGIN ", "SELECT ; WITH runs_run", "SELECT runs_run"]
