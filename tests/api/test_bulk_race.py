"""Bulk cancel by filter against real worker processes (docs/design/commands.md#bulk-commands): 500
runs of one customer among 2,000, cancelled by their metadata while workers run them, on PostgreSQL."""

import time
from collections import Counter

import pytest
from django.contrib.auth.models import User

from runs.events import EventType
from runs.models import IdempotencyRecord, Run, RunEvent
from runs.transitions import TERMINAL
from tests.support.api import api_for, assert_error
from tests.support.checks import assert_nothing_after_terminal
from tests.support.many_runs import create_runs
from tests.support.procs import Procs
from tests.support.runs import released
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

CUSTOMER = {"customer": "42"}
# Each run streams for ~50 s unless something ends it: none completes during the test, so each of
# the customer's runs is there to be cancelled, queued or running.
LONG = {"deltas": 1000, "delay_ms": 50}


@pytest.mark.timeout(90)
def test_500_runs_of_a_customer_among_2000_are_cancelled_once_each_while_workers_run_them(
    procs: Procs, alice: User, bob: User
) -> None:
    started = time.monotonic()
    theirs: list[Run] = []
    others: list[Run] = []
    # Interleaved, so that the workers (oldest first) take some of the customer's runs too.
    for _ in range(500):
        theirs += create_runs(alice, 1, metadata=CUSTOMER, input=LONG)
        others += create_runs(alice, 3, metadata={"customer": "7"}, input=LONG)
    bobs = create_runs(bob, 20, metadata=CUSTOMER, input=LONG)
    made = time.monotonic() - started
    for name in ("w1", "w2"):
        procs.worker(name, concurrency=2)
    theirs_ids = {run.pk for run in theirs}
    wait_until(
        lambda: Run.objects.filter(pk__in=theirs_ids, status="running").exists(),
        timeout=30,
        what="the workers running one of the customer's runs",
    )
    api = api_for(alice)
    request = {"filter": {"metadata": CUSTOMER}, "max": 500, "note": "customer 42 left"}

    over = api.post("/api/runs/cancel/", {**request, "max": 100}, format="json", HTTP_IDEMPOTENCY_KEY="incident")
    assert assert_error(over, 409, "too_many_matches")["error"]["detail"]["count"] == 500
    assert not RunEvent.objects.filter(type=EventType.RUN_CANCELLED).exists()

    running_before = set(Run.objects.filter(pk__in=theirs_ids, status="running").values_list("pk", flat=True))
    cancel_started = time.monotonic()
    answer = api.post("/api/runs/cancel/", request, format="json", HTTP_IDEMPOTENCY_KEY="incident")
    took = time.monotonic() - cancel_started
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["counts"]["cancelled"] == 500, body["counts"]
    assert {str(pk) for pk in theirs_ids} == set(body["ids"]["cancelled"])

    cancels = Counter(RunEvent.objects.filter(type=EventType.RUN_CANCELLED).values_list("run_id", flat=True))
    assert set(cancels) == theirs_ids and set(cancels.values()) == {1}
    assert set(Run.objects.filter(pk__in=theirs_ids).values_list("status", flat=True)) == {"cancelled"}
    untouched = [run.pk for run in others + bobs]
    assert not Run.objects.filter(pk__in=untouched, status__in=[s.value for s in TERMINAL]).exists()

    # The workers stopped the customer's runs they held, and wrote nothing after the cancel.
    for run in Run.objects.filter(pk__in=running_before):
        wait_until(lambda run=run: released(run), timeout=20, what=f"the attempt of {run.pk} released")
        assert_nothing_after_terminal(run)

    events = RunEvent.objects.filter(run_id__in=theirs_ids).count()
    records = IdempotencyRecord.objects.count()
    again = api.post("/api/runs/cancel/", request, format="json", HTTP_IDEMPOTENCY_KEY="incident")
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    assert again.json() == body
    assert RunEvent.objects.filter(run_id__in=theirs_ids).count() == events
    assert IdempotencyRecord.objects.count() == records
    print(f"\n2,020 runs made in {made:.1f} s; 500 cancelled in {took:.2f} s")
