"""Races between real threads, each on its own database connection (transaction=True)."""

import random
import threading
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import User
from django.db import connection

from runs import services
from runs.exceptions import RunConflict
from runs.models import RunAttempt, RunEvent, WebhookDelivery, WebhookEndpoint
from runs.services.core import lock_run
from runs.services.creation import RunSpec, insert_run
from runs.services.webhook_endpoints import webhook_create
from runs.transitions import FailCode
from tests.conftest import ON_SQLITE
from tests.factories import assert_log_is_sound, queued_run, running_run
from tests.support.threads import first_holds_second_waits, race, race_a_cancel

RACERS = 50
RUNS = 3 if ON_SQLITE else 6


def _end_command(run_id: Any, generation: int, actor: User, kind: str) -> Any:
    if kind == "cancel":
        return services.run_cancel(run_id=run_id, actor=actor, note="race")
    if kind == "stop":
        return services.run_stop(run_id=run_id, actor=actor, reason="race")
    if kind == "complete":
        return services.run_complete(run_id=run_id, generation=generation, output="done")
    return services.run_fail(run_id=run_id, generation=generation, code=FailCode.AGENT_ERROR, reason="race")


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
def test_concurrent_cancel_stop_complete_fail_end_a_run_exactly_once(alice: User) -> None:
    rng = random.Random(20261129)
    for _ in range(RUNS):
        run = running_run(alice)
        kinds = [rng.choice(["cancel", "stop", "complete", "fail"]) for _ in range(RACERS)]
        results = race(RACERS, lambda i, run=run, kinds=kinds: _end_command(run.pk, 1, alice, kinds[i]))

        unexpected = [r for r in results if isinstance(r, BaseException) and not isinstance(r, RunConflict)]
        assert unexpected == []
        events = assert_log_is_sound(run)
        run.refresh_from_db()
        # Exactly one command won; every idempotent repeat of the winner wrote nothing, and every
        # other command lost with the committed state.
        winners = [r for r in results if not isinstance(r, BaseException) and getattr(r, "changed", True)]
        assert len(winners) == 1
        for r in results:
            if isinstance(r, RunConflict):
                assert r.run is not None and r.run.status == run.status
        assert sum(1 for e in events if e.type == f"run.{run.status}") == 1
        assert [e.type for e in events[:2]] == ["run.created", "run.started"]
        assert len(events) == 3


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
def test_concurrent_appends_to_one_run_get_gap_free_seq(alice: User) -> None:
    run = running_run(alice)
    per_thread = 25

    def append(i: int) -> None:
        for j in range(per_thread):
            services.run_events_append(run_id=run.pk, generation=1, events=[("output.delta", {"text": f"{i}:{j}"})])

    results = race(8, append)
    assert [r for r in results if r is not None] == []
    events = assert_log_is_sound(run)
    assert len(events) == 2 + 8 * per_thread
    texts = [e.data["text"] for e in events[2:]]
    assert len(set(texts)) == len(texts)
    # Each thread's own appends keep their order.
    for i in range(8):
        mine = [t for t in texts if t.startswith(f"{i}:")]
        assert mine == [f"{i}:{j}" for j in range(per_thread)]


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
def test_appends_racing_a_cancel_never_land_after_the_terminal_event(alice: User) -> None:
    for _ in range(RUNS):
        run = running_run(alice)

        def append_ten(run_id: Any = run.pk) -> None:
            for _ in range(10):
                services.run_events_append(run_id=run_id, generation=1, events=[("output.delta", {"text": "x"})])

        results = race_a_cancel(8, run, alice, append_ten)
        assert all(r is None or not isinstance(r, BaseException) or isinstance(r, RunConflict) for r in results)
        events = assert_log_is_sound(run)
        assert events[-1].type == "run.cancelled"


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
def test_concurrent_claims_never_take_one_run_twice(alice: User) -> None:
    runs = {queued_run(alice).pk for _ in range(30)}

    def claim_all(i: int) -> list[Any]:
        mine = []
        while (claimed := services.run_claim(worker=f"w{i}")) is not None:
            mine.append(claimed[0].pk)
        return mine

    results = race(6, claim_all)
    claimed = [pk for r in results for pk in r]
    assert sorted(map(str, claimed)) == sorted(map(str, runs))
    assert RunAttempt.objects.filter(generation=1).count() == 30


@pytest.mark.django_db(transaction=True)
def test_claim_skips_a_run_another_connection_holds_locked(alice: User) -> None:
    first = queued_run(alice)
    second = queued_run(alice)
    settings = connection.settings_dict
    held = threading.Event()
    release = threading.Event()

    def hold_lock() -> None:
        # A separate raw connection holds the oldest queued run's row lock, as a slow claimer would.
        with (
            psycopg.connect(
                host=settings["HOST"], port=settings["PORT"], user=settings["USER"], dbname=settings["NAME"]
            ) as conn,
            conn.transaction(),
        ):
            conn.execute("SELECT id FROM runs_run WHERE id = %s FOR NO KEY UPDATE", [first.pk])
            held.set()
            release.wait(timeout=30)

    holder = threading.Thread(target=hold_lock)
    holder.start()
    try:
        assert held.wait(timeout=30)
        claimed = services.run_claim(worker="w")
        assert claimed is not None and claimed[0].pk == second.pk
        assert services.run_claim(worker="w") is None  # the locked one is skipped, not waited for
    finally:
        release.set()
        holder.join(timeout=30)
    claimed = services.run_claim(worker="w")
    assert claimed is not None and claimed[0].pk == first.pk


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
def test_creating_children_while_the_parent_is_cancelled_leaves_no_live_orphan(alice: User) -> None:
    for _ in range(RUNS):
        parent = running_run(alice)

        results = race_a_cancel(10, parent, alice, lambda parent_id=parent.pk: queued_run(alice, parent_id=parent_id))
        assert all(not isinstance(r, BaseException) or isinstance(r, RunConflict) for r in results)
        children = list(parent.children.all())
        assert all(child.status == "cancelled" and child.end_code == "parent_cancelled" for child in children)
        assert RunEvent.objects.filter(run__in=children, type="run.cancelled").count() == len(children)


# PostgreSQL: a cancel that waits for the run's lock, and what committed while it waited. What the
# cancel reads beside the run (`runs.services.locks.Around`) is read after its lock is granted, so
# it sees it; inside the locking statement it would not (its snapshot is from before the wait).


@pytest.mark.django_db(transaction=True)
def test_a_child_created_while_a_cancel_waits_for_its_parent_is_cancelled_with_it(alice: User) -> None:
    parent = running_run(alice)

    def create_child() -> None:
        insert_run(RunSpec(agent="demo", input={}, parent_id=parent.pk), owner=alice)

    first_holds_second_waits(create_child, lambda: services.run_cancel(run_id=parent.pk, actor=alice))
    (child,) = parent.children.all()
    assert (child.status, child.end_code) == ("cancelled", "parent_cancelled")


@pytest.mark.django_db(transaction=True)
def test_an_endpoint_registered_while_a_cancel_waits_for_the_run_gets_its_notification(alice: User) -> None:
    run = running_run(alice)
    registered: list[WebhookEndpoint] = []

    def register() -> None:
        registered.append(webhook_create(owner=alice, url="https://hooks.example.test/in", events=["run.cancelled"]))

    first_holds_second_waits(
        lambda: lock_run(run.pk), lambda: services.run_cancel(run_id=run.pk, actor=alice), meanwhile=register
    )
    (delivery,) = WebhookDelivery.objects.filter(run_id=run.pk)
    assert delivery.endpoint_id == registered[0].pk and delivery.event_type == "run.cancelled"
