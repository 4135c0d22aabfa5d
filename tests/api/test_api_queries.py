"""The statements each hot endpoint sends: authentication (the token with its address's
throttle standing, one statement), the locked transaction and the response — no read before the
transaction, none of the run again after it. And the worker's claim, the middle of the start path.

Counted on PostgreSQL (this file is not in the SQLite selection), where `BEGIN`/`COMMIT` and the
notifications are statements of their own."""

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.http import HttpResponse
from django.test import Client, RequestFactory, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from runs import services
from runs.models import PRIORITY_MAX
from runs.prepared import SEPARATOR
from runs.services.webhook_endpoints import webhook_create
from runs.streaming.checks import open_checks
from tests.factories import queued_run, running_run
from tests.support.db import token_for
from tests.support.threads import rows_held
from tests.support.token_cache import token_cache_listening
from tests.support.wire import round_trips, wire_messages

pytestmark = pytest.mark.django_db(transaction=True)


def statements(call: Callable[[], Any], status: int) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        response = call()
    assert response.status_code == status, response.content
    return _kinds(captured)


def _kinds(captured: CaptureQueriesContext) -> list[str]:
    """Each round trip: its statements (a send of several: runs.services.statements), each as its
    first word and the table it is about. Django logs a BEGIN as the atomic block starts, which psycopg
    sends with the next statement, in a round trip of its own, unless the statements sent together
    start with it (runs.prepared): then it is theirs, and Django's is not listed. A COMMIT sent with
    the last writes (`holding`) ends their round trip; Django still logs its own at the atomic
    block's end, which sends nothing then (tests/core/test_statements.py): not listed either."""
    kinds: list[str] = []
    for query in captured.captured_queries:
        kind = " + ".join(_kind(sql) for sql in query["sql"].split(SEPARATOR))
        if kind.startswith(f"{BEGIN} + ") and kinds and kinds[-1] == BEGIN:
            kinds.pop()
        if not (kind == COMMIT and kinds and kinds[-1].endswith(f"+ {COMMIT}")):
            kinds.append(kind)
    return kinds


BEGIN, COMMIT = "BEGIN ", "COMMIT "


def _kind(sql: str) -> str:
    return sql.split(None, 1)[0] + " " + _table(sql)


def _table(sql: str) -> str:
    """The first of the tables it names (a statement's own table comes before any subquery's)."""
    named = [
        # At one place, the longer name: "runs_run" is the start of "runs_runevent"
        (found.start(), -len(word), word)
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
        )
        if (found := re.search(word, sql))
    ]
    return min(named)[2] if named else ""


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
        # The transaction's BEGIN with its first statements (runs.prepared). FOR NO KEY UPDATE, the
        # owner joined: visibility, permission, transition; then, once the lock is held, whether any
        # child is unfinished and any endpoint enabled (runs.services.locks.Around)
        "BEGIN  + SELECT runs_run + SELECT runs_run",
        # Neither: no read of them. The event, the run, the notification and the COMMIT, one round trip
        "INSERT runs_runevent + UPDATE runs_run + SELECT pg_notify + COMMIT ",
    ]
    assert statements(lambda: api.post(url(running, "cancel"), {}), 200) == [
        "SELECT runs_apitoken",
        "BEGIN  + SELECT runs_run + SELECT runs_run",
        # The attempt closed, RETURNING it: the answer shows it without a read after the commit
        "INSERT runs_runevent + UPDATE runs_runattempt + UPDATE runs_run + SELECT pg_notify + COMMIT ",
    ]


def test_a_create_and_a_read_send_no_statement_beyond_their_work(api: APIClient, alice: User) -> None:
    assert statements(lambda: api.post("/api/runs/", {"agent": "demo", "input": {}}), 201) == [
        "SELECT runs_apitoken",
        # BEGIN, then pg_advisory_xact_lock: the owner's creates, one at a time; then, a statement of its
        # own (its snapshot taken once the lock is held), their totals (active, kept, bytes): the caps' truth
        "BEGIN  + SELECT  + SELECT runs_run",
        # The run with its last_seq (no second write of the row), and events and queue, one notification
        "INSERT runs_runevent + INSERT runs_run + SELECT pg_notify + COMMIT ",
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
    with CaptureQueriesContext(connection) as captured:
        assert api.post("/api/runs/", body, format="json").status_code == 201
    assert _kinds(captured) == [
        "SELECT runs_apitoken",
        "BEGIN  + SELECT  + SELECT runs_run",  # the owner's lock: a run scheduled ahead counts against the caps like any
        "INSERT runs_runevent + INSERT runs_run + SELECT pg_notify + COMMIT ",
    ]
    # The queue's note says when it falls due, by the database's clock: the workers wake then, and
    # not now to find nothing to claim (docs/design/fair-use.md#start-after).
    assert "EXTRACT(EPOCH FROM" in next(q["sql"] for q in captured.captured_queries if "pg_notify" in q["sql"])


def test_a_read_of_a_claimed_or_ended_run_is_one_statement_with_its_attempt_and_partial_output(
    api: APIClient, alice: User
) -> None:
    running = running_run(alice)
    assert statements(lambda: api.get(url(running)), 200) == [
        "SELECT runs_apitoken",
        "SELECT runs_run",  # its current attempt joined on (run, generation) (docs/design/api.md#hot-reads)
    ]
    services.run_events_append(
        run_id=running.pk, generation=running.generation, events=[("output.delta", {"text": "half"})]
    )
    services.run_cancel(run_id=running.pk, actor=alice)
    with CaptureQueriesContext(connection) as captured:
        response = api.get(url(running))
    assert response.status_code == 200 and response.json()["partial_output"] == {"text": "half"}
    assert _kinds(captured) == [
        "SELECT runs_apitoken",
        "SELECT runs_run",  # + the partial output, a scalar subquery (docs/design/execution.md#partial-output)
    ]
    assert "runs_runevent" in captured.captured_queries[1]["sql"]


def test_a_cancel_with_a_webhook_endpoint_adds_the_outbox_writes(api: APIClient, alice: User) -> None:
    first, second = running_run(alice), running_run(alice)
    without = statements(lambda: api.post(url(first, "cancel"), {}), 200)
    webhook_create(owner=alice, url="https://hooks.example.test/in", events=["run.cancelled"])
    assert statements(lambda: api.post(url(second, "cancel"), {}), 200) == [
        *without[:2],  # the token, and the lock with its BEGIN, which now finds an endpoint enabled
        # The endpoints, FOR KEY SHARE, read with the event and the attempt written: the notification's
        # body is the run as it ended, its attempt from this UPDATE's RETURNING
        "INSERT runs_runevent + UPDATE runs_runattempt + SELECT runs_webhookendpoint",
        # The body stored once, a delivery per endpoint, and `webhooks_due` in the one notification statement
        "INSERT runs_webhooknotification + INSERT runs_webhookdelivery + UPDATE runs_run + SELECT pg_notify + COMMIT ",
    ]


def test_a_page_of_events_reads_the_run_and_its_events(api: APIClient, alice: User) -> None:
    run = queued_run(alice)
    assert statements(lambda: api.get(url(run, "events")), 200) == [
        "SELECT runs_apitoken",
        "SELECT runs_run",  # its agent and last_seq
        "WITH runs_runevent",  # the page and the run's state, one statement (runs.selectors.wire)
    ]


CLAIM_WRITES = "INSERT runs_runattempt + INSERT runs_runevent + SELECT pg_notify + UPDATE runs_run + COMMIT "


def test_a_claim_is_one_transaction_that_opens_the_attempt_and_writes_run_started(alice: User) -> None:
    """The start path's middle (docs/design/execution.md#claims): what a worker sends between a
    create's notification and the watcher's `run.started` — two round trips."""
    queued_run(alice)
    with CaptureQueriesContext(connection) as captured:
        assert services.run_claim(worker="w") is not None
    assert _kinds(captured) == [
        # The transaction's BEGIN with one statement: the owners in fair-share order, whether a run
        # that jumps fair share is queued (none is, so no statement looks for one), and the first
        # owner's first claimable run, locked, with the database's clock (runs.services.ranking)
        "BEGIN  + WITH runs_run",
        # The attempt, run.started, its notification, the run and the COMMIT: one round trip
        # (runs.services.statements).
        CLAIM_WRITES,
    ]
    with CaptureQueriesContext(connection) as captured:
        assert services.run_claim(worker="w") is None
    # Nothing to take: the transaction ends at once, its COMMIT a round trip of its own.
    assert _kinds(captured) == ["BEGIN  + WITH runs_run", COMMIT]


def test_a_claim_not_told_of_a_run_reads_the_ranking_first_and_alone(alice: User) -> None:
    """`expect_run=False` (a poll's claim, the claim after a taken run): nothing to take is one
    statement and no transaction; a run to take, one round trip more than told."""
    with CaptureQueriesContext(connection) as captured:
        assert services.run_claim(worker="w", expect_run=False) is None
    assert _kinds(captured) == ["WITH runs_run"]
    queued_run(alice)
    with CaptureQueriesContext(connection) as captured:
        assert services.run_claim(worker="w", expect_run=False) is not None
    assert _kinds(captured) == [
        "WITH runs_run",  # the ranking, before the transaction
        "BEGIN  + SELECT runs_run",  # that owner's first claimable run, locked, with the database's clock
        CLAIM_WRITES,
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
        "BEGIN  + WITH runs_run",  # the ranking says one is queued: no run of the first owner locked
        "SELECT runs_run",  # the urgent run, locked, with the clock: no fair-share pick after it
        CLAIM_WRITES,
    ]
    with CaptureQueriesContext(connection) as captured:
        assert services.run_claim(worker="w") is not None  # alice's, by fair share
    assert _kinds(captured) == ["BEGIN  + WITH runs_run", CLAIM_WRITES]


def test_a_claim_whose_first_owners_runs_another_transaction_holds_takes_the_next_owners(
    alice: User, bob: User
) -> None:
    """The fold's fallback (docs/design/execution.md#claims): another connection's open transaction
    holds Alice's run, as a claim in flight would; the ranking read with the pick says Bob is next,
    and the same transaction takes his run, one statement later."""
    alices, bobs = queued_run(alice), queued_run(bob)
    with rows_held(alices.pk):
        with CaptureQueriesContext(connection) as captured:
            claimed = services.run_claim(worker="w")
        assert claimed is not None and claimed[0].pk == bobs.pk
        assert _kinds(captured) == [
            "BEGIN  + WITH runs_run",  # Alice first: her run held, passed over, nothing locked
            "SELECT runs_run",  # Bob's, locked
            CLAIM_WRITES,
        ]
        with CaptureQueriesContext(connection) as captured:
            assert services.run_claim(worker="w") is None  # Alice's still held: skipped, not waited for
        assert _kinds(captured) == ["BEGIN  + WITH runs_run", COMMIT]
    claimed = services.run_claim(worker="w")
    assert claimed is not None and claimed[0].pk == alices.pk


def test_a_claim_takes_an_urgent_run_first_and_fair_share_while_another_transaction_holds_it(
    alice: User, make_user: Callable[..., User]
) -> None:
    """docs/design/fair-use.md#priority, through the fold: the ranking says an urgent run is queued,
    so the first owner's run is not locked with it; the urgent run held elsewhere, fair share takes
    its turn from the first owner on."""
    alices = queued_run(alice)
    urgent = queued_run(make_user("staff", perms=("runs.prioritize_run",)), priority=PRIORITY_MAX + 1)
    with rows_held(urgent.pk):
        with CaptureQueriesContext(connection) as captured:
            claimed = services.run_claim(worker="w")
        assert claimed is not None and claimed[0].pk == alices.pk
        assert _kinds(captured) == [
            "BEGIN  + WITH runs_run",  # an urgent run is queued: none of Alice's locked
            "SELECT runs_run",  # the urgent run: held, passed over
            "SELECT runs_run",  # Alice's, first by fair share, locked
            CLAIM_WRITES,
        ]
    claimed = services.run_claim(worker="w")
    assert claimed is not None and claimed[0].pk == urgent.pk


def test_a_claims_statements_are_planned_once_per_connection(alice: User, make_user: Callable[..., User]) -> None:
    """Their constants are written into their text (runs.services.ranking, and the picks'
    `CompiledRead(inline=True)`): given as parameters, a status compared with a partial index's
    predicate left the server to plan the ranking again at every claim (~1 ms of its time: a generic
    plan cannot use the index). A prepared statement without parameters is planned once; the pick
    of an owner's run has the owner alone, so a plan of its own once five custom ones are made."""
    staff = make_user("staff", perms=("runs.prioritize_run",))
    for expect_run in (True, False) * 8:
        queued_run(alice)
        queued_run(staff, priority=PRIORITY_MAX + 1)  # the urgent pick too
        for _ in range(2):
            assert services.run_claim(worker="w", expect_run=expect_run) is not None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT statement LIKE '%%$1%%', custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE '%%WITH RECURSIVE owners%%' OR statement LIKE '%%SKIP LOCKED%%'"
        )
        custom = sorted(cursor.fetchall())
    # The ranking alone, the ranking with the pick, the urgent pick; the pick of an owner's run.
    assert len(custom) == 4 and custom[:3] == [(False, 0)] * 3 and custom[3][0] and custom[3][1] <= 5, custom


@override_settings(RUNLEDGER_MAX_RUNNING_PER_USER=2)
def test_a_claim_under_a_running_cap_takes_the_claims_lock_with_the_ranking(alice: User) -> None:
    """docs/design/fair-use.md#fair-claiming: the lock and the ranking read after it, one round trip,
    in the transaction."""
    queued_run(alice)
    with CaptureQueriesContext(connection) as captured:
        assert services.run_claim(worker="w") is not None
    assert _kinds(captured)[:2] == ["BEGIN  + SELECT  + WITH runs_run", "SELECT runs_run"]


def test_with_the_token_cache_warm_a_read_sends_the_run_alone_and_a_cancel_no_token_read(
    api: APIClient, alice: User
) -> None:
    """A web process listening for revocations answers a good key it read a moment ago from memory
    (docs/design/api.md#token-cache): the request's own statements only."""
    running, queued = running_run(alice), queued_run(alice)
    with token_cache_listening():
        assert statements(lambda: api.get(url(queued)), 200) == ["SELECT runs_apitoken", "SELECT runs_run"]
        assert statements(lambda: api.get(url(queued)), 200) == ["SELECT runs_run"]
        assert statements(lambda: api.post(url(running, "cancel"), {}), 200) == [
            "BEGIN  + SELECT runs_run + SELECT runs_run",
            "INSERT runs_runevent + UPDATE runs_runattempt + UPDATE runs_run + SELECT pg_notify + COMMIT ",
        ]
    # The listener gone, the statement is back.
    assert statements(lambda: api.get(url(queued)), 200) == ["SELECT runs_apitoken", "SELECT runs_run"]


def test_on_the_wire_a_create_and_a_cancel_are_two_round_trips_and_a_read_one(api: APIClient, alice: User) -> None:
    """What the connection sends and waits for (libpq's trace), with the token cache warm: a
    transaction's BEGIN goes with its first statements (runs.prepared), its COMMIT with its last
    writes — no round trip of its own for either."""
    running = running_run(alice)
    ahead = (timezone.now() + timedelta(hours=1)).isoformat()
    with token_cache_listening():
        assert api.get(url(running)).status_code == 200  # the key read once, then kept

        def executes(call: Callable[[], Any], status: int) -> list[int]:
            with wire_messages() as messages:
                assert call().status_code == status
            return [trip.count("Execute") for trip in round_trips(messages)]

        assert executes(lambda: api.get(url(running)), 200) == [1]
        create = {"agent": "demo", "input": {}, "start_after": ahead}
        # BEGIN, the owner's lock, the caps' totals; the event, the run, the notification, COMMIT
        assert executes(lambda: api.post("/api/runs/", create, format="json"), 201) == [3, 4]
        # BEGIN, the lock, what is around it; the event, the attempt, the run, the notification, COMMIT
        assert executes(lambda: api.post(url(running, "cancel"), {}), 200) == [3, 5]


def test_on_the_wire_a_claim_is_two_round_trips_and_one_that_finds_nothing_two_or_one(alice: User) -> None:
    """The ranking and the pick, locked, with the transaction's BEGIN; the writes with its COMMIT.
    Nothing to take: the BEGIN, the ranking, then the COMMIT; not told of a run, the ranking alone."""
    queued_run(alice)
    with wire_messages() as messages:
        assert services.run_claim(worker="w") is not None
    # BEGIN, the ranking with the pick; the attempt, run.started, its notification, the run, COMMIT
    assert [trip.count("Execute") for trip in round_trips(messages)] == [2, 5]
    with wire_messages() as messages:
        assert services.run_claim(worker="w") is None
    # BEGIN, the ranking with the pick; the COMMIT, which psycopg sends as a simple query
    assert [(trip.count("Execute"), trip.count("Query")) for trip in round_trips(messages)] == [(2, 0), (0, 1)]
    with wire_messages() as messages:
        assert services.run_claim(worker="w", expect_run=False) is None
    assert [trip.count("Execute") for trip in round_trips(messages)] == [1]


def test_on_the_wire_a_streams_checks_and_its_first_events_are_one_round_trip(alice: User, bob: User) -> None:
    """A stream's opening (runs.streaming.checks) reads the run and the events after the cursor in
    one send, the events dropped unless the run is the user's to see."""
    running = running_run(alice)
    services.run_events_append(run_id=running.pk, generation=1, events=[("output.delta", {"text": "hi"})])

    tokens = {user: token_for(user) for user in (alice, bob)}

    def opening(user: User) -> Any:
        request = RequestFactory().get(
            f"/api/runs/{running.pk}/stream/?after_seq=0", HTTP_AUTHORIZATION=f"Token {tokens[user]}"
        )
        return open_checks(request, str(running.pk), first_rows=100)

    with token_cache_listening():
        opening(alice)  # the key read once, then kept
        with wire_messages() as messages:
            opened = opening(alice)
        assert not isinstance(opened, HttpResponse) and opened.first is not None
        assert [seq for seq, _, _ in opened.first.rows] == [1, 2, 3]  # run.created, run.started, the delta
        # The run; the events after the cursor
        assert [trip.count("Execute") for trip in round_trips(messages)] == [2]
        opening(bob)
        refused = opening(bob)
    assert isinstance(refused, HttpResponse) and refused.status_code == 404
