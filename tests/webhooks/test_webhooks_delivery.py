"""Webhooks delivered by real worker processes to a receiver in its own process, which verifies
every request with the `standardwebhooks` package (tests/support/webhook_receiver.py): each ending
status and a wait, a rotation's overlap, a redirect not followed, the receiver down then up, a
worker SIGKILLed mid-request, PostgreSQL restarted mid-load, and 2,000 runs ending while the
receiver fails every third request (docs/design/webhooks.md)."""

from collections import defaultdict
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models import Count
from django.utils import timezone

from runs import services
from runs.models import DeliveryStatus, Run, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from runs.services import RunSpec
from runs.services.core import end
from runs.services.creation import insert_run
from runs.services.webhook_endpoints import webhook_create, webhook_rotate_secret
from runs.transitions import CancelCode, FailCode, Status
from tests.factories import queued_run, running_run
from tests.support.pg import PgCluster
from tests.support.procs import Proc, Procs, subprocess_env
from tests.support.waiting import wait_until
from tests.support.webhooks import Receiver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

# Short enough that a retry, a lease's lapse and a give-up take seconds, not minutes.
FAST = {
    "RUNLEDGER_WEBHOOKS_ALLOW_PRIVATE": "1",
    "RUNLEDGER_WEBHOOKS_TIMEOUT_SECONDS": "1",
    "RUNLEDGER_WEBHOOKS_RETRY_BASE_SECONDS": "0.2",
    "RUNLEDGER_WEBHOOKS_RETRY_MAX_SECONDS": "1",
    "RUNLEDGER_WEBHOOKS_BATCH": "50",
}
LEASE = 2 * float(FAST["RUNLEDGER_WEBHOOKS_TIMEOUT_SECONDS"]) + 1
LATER = timedelta(hours=1)


@pytest.fixture(autouse=True)
def _private_allowed(settings: object) -> None:
    settings.RUNLEDGER_WEBHOOKS_ALLOW_PRIVATE = True  # type: ignore[attr-defined]


def worker(procs: Procs, name: str, **extra: str) -> Proc:
    return procs.worker(name, concurrency=2, env=subprocess_env(**FAST, **extra))


def endpoint(owner: User, receiver: Receiver, path: str = "/in", events: list[str] | None = None) -> WebhookEndpoint:
    all_events = ["run.cancelled", "run.completed", "run.failed", "run.stopped", "run.waiting"]
    return webhook_create(owner=owner, url=receiver.url(path), events=events or all_events)


def receiving(procs: Procs, tmp: Path, owner: User, *args: str) -> Receiver:
    """A receiver up, for `owner`'s endpoint of cancels."""
    receiver = Receiver(procs, tmp)
    return receiver.start([endpoint(owner, receiver, events=["run.cancelled"]).secret], *args)


def cancel_later_run(owner: User) -> Run:
    """A run no worker claims (its start is an hour away), cancelled."""
    run = queued_run(owner, start_after=timezone.now() + LATER)
    return services.run_cancel(run_id=run.pk, actor=owner).run


def delivered_ids() -> set[str]:
    return {
        f"msg_{pk.hex}"
        for pk in WebhookDelivery.objects.filter(status=DeliveryStatus.DELIVERED).values_list("pk", flat=True)
    }


def verified(receiver: Receiver) -> dict[str, list[dict[str, object]]]:
    by_id: dict[str, list[dict[str, object]]] = defaultdict(list)
    for line in receiver.got():
        if line.get("verified"):
            by_id[str(line["id"])].append(line)
    return by_id


@pytest.mark.sqlite
def test_each_end_and_a_wait_arrive_verified_through_a_rotation_and_a_redirect_is_not_followed(
    procs: Procs, tmp_path: Path, alice: User
) -> None:
    receiver = Receiver(procs, tmp_path)
    hook = endpoint(alice, receiver)
    receiver.start([hook.secret])
    redirected = endpoint(alice, receiver, "/redirect", ["run.cancelled"])
    failing = running_run(alice)  # first: the one queued run it claims
    failed = services.run_fail(run_id=failing.pk, generation=failing.generation, code=FailCode.AGENT_ERROR, reason="x")
    runs = {
        "run.completed": queued_run(alice, input={"deltas": 2, "delay_ms": 1}),
        "run.failed": failed,
        "run.waiting": queued_run(alice, input={"deltas": 2, "delay_ms": 1, "ask": "name?"}),
        "run.cancelled": cancel_later_run(alice),
        "run.stopped": services.run_stop(
            run_id=queued_run(alice, start_after=timezone.now() + LATER).pk, actor=None, reason="policy"
        ).run,
    }
    worker(procs, "w1")

    def arrived() -> dict[str, dict[str, object]]:
        return {str(line["type"]): line for lines in verified(receiver).values() for line in lines}

    got = wait_until(lambda: len(arrived()) == 5 and arrived(), timeout=30, what="the five notifications")
    for type_, run in runs.items():
        assert got[type_]["run_id"] == str(run.pk), got
        assert got[type_]["run_status"] == type_.removeprefix("run.")
    # Rotation: a receiver still on the old secret verifies what is sent during the overlap, and so
    # does one on the new secret.
    old = hook.secret
    new = webhook_rotate_secret(endpoint_id=hook.pk, user=alice).secret
    for trusted in ([old], [new]):
        receiver.trust(trusted)
        run = cancel_later_run(alice)
        wait_until(
            lambda run=run: any(line.get("run_id") == str(run.pk) for line in receiver.got() if line.get("verified")),
            timeout=15,
            what=f"the delivery verified with the {'old' if trusted == [old] else 'new'} secret",
        )
    # The redirect was answered 302 and never followed: nothing of it reached /in.
    redirect = wait_until(
        lambda: WebhookAttempt.objects.filter(delivery__endpoint=redirected).first(), timeout=15, what="the 302"
    )
    assert redirect.status_code == 302 and "not followed" in redirect.error
    mine = {f"msg_{pk.hex}" for pk in WebhookDelivery.objects.filter(endpoint=redirected).values_list("pk", flat=True)}
    assert not [line for line in receiver.got() if line["id"] in mine and line["path"] != "/redirect"]


@pytest.mark.sqlite
def test_a_receiver_down_then_up_gets_every_notification_with_its_one_id(
    procs: Procs, tmp_path: Path, alice: User
) -> None:
    receiver = Receiver(procs, tmp_path)
    hook = endpoint(alice, receiver, events=["run.cancelled"])
    worker(procs, "w1")
    runs = [cancel_later_run(alice) for _ in range(20)]
    # Down until every delivery has failed twice: retried, with backoff, while nobody answers.
    refused = WebhookDelivery.objects.filter(endpoint=hook, attempt_log__status_code__isnull=True)
    wait_until(
        lambda: refused.annotate(n=Count("attempt_log")).filter(n__gte=2).count() == 20,
        timeout=30,
        what="every delivery refused twice",
    )
    receiver.start([hook.secret])
    wait_until(lambda: len(delivered_ids()) == 20, timeout=30, what="all 20 delivered")
    by_id = verified(receiver)
    assert set(by_id) == delivered_ids()
    # One id per event: each run's cancel arrived under exactly one id.
    ids_of_run: dict[object, set[str]] = defaultdict(set)
    for webhook_id, lines in by_id.items():
        for line in lines:
            ids_of_run[line["run_id"]].add(webhook_id)
    assert {str(run.pk) for run in runs} == set(ids_of_run) and all(len(ids) == 1 for ids in ids_of_run.values())


@pytest.mark.sqlite
def test_a_worker_killed_mid_request_leaves_it_to_another_with_the_same_id(
    procs: Procs, tmp_path: Path, alice: User
) -> None:
    receiver = receiving(procs, tmp_path, alice, "--hold-first")
    first = worker(procs, "w1")
    cancel_later_run(alice)
    held = wait_until(lambda: [line for line in receiver.got() if line.get("held")], timeout=15, what="held")
    first.kill()  # SIGKILL, mid-request: no unwinding, its claim left as it was
    worker(procs, "w2")
    wait_until(lambda: len(delivered_ids()) == 1, timeout=LEASE + 20, what="delivered by the second worker")
    assert list(verified(receiver)) == [held[0]["id"]] == list(delivered_ids())
    row = WebhookDelivery.objects.get()
    assert row.attempts == 2 and list(row.attempt_log.values_list("worker", flat=True)) == ["w2"]


def _ended_in_bulk(owner: User, count: int, *, per_transaction: int = 500) -> list[str]:
    """`count` runs of `owner` created and ended (cancelled) through the write core, many to a
    transaction: a crowd of ends in seconds, each written with its notification."""
    ids: list[str] = []
    spec = RunSpec(agent="demo", input={"deltas": 1}, start_after=timezone.now() + LATER)
    while len(ids) < count:
        with transaction.atomic():
            for _ in range(min(per_transaction, count - len(ids))):
                run = insert_run(spec, owner=owner, capped=False)
                end(run, Status.CANCELLED, code=CancelCode.BY_USER, reason="", by=owner.username, now=timezone.now())
                ids.append(str(run.pk))
    return ids


@pytest.mark.pg_cluster
def test_a_postgresql_restart_mid_load_loses_no_notification(
    procs: Procs, tmp_path: Path, alice: User, pg_cluster: PgCluster
) -> None:
    receiver = receiving(procs, tmp_path, alice)
    workers = [worker(procs, f"w{i}") for i in range(2)]
    ids = _ended_in_bulk(alice, 300, per_transaction=50)
    wait_until(lambda: len(delivered_ids()) >= 50, timeout=30, what="deliveries under way")
    connection.close()
    pg_cluster.stop()
    # The outage lasts until a worker has felt it: a claim or a record of deliveries failed.
    wait_until(
        lambda: any("webhook deliveries (" in proc.log() for proc in workers), timeout=30, what="the outage felt"
    )
    pg_cluster.start()
    wait_until(lambda: len(delivered_ids()) == 300, timeout=60, what="all 300 delivered after the restart")
    assert {line["run_id"] for lines in verified(receiver).values() for line in lines} == set(ids)
    for proc in workers:
        assert proc.popen.poll() is None, proc.log()


# In the parallel pass, like the bulk race's 2,000 runs: it loads two workers and a receiver, not the machine.
@pytest.mark.timeout(240)
def test_two_thousand_runs_ending_while_every_third_request_fails_are_all_delivered(
    procs: Procs, tmp_path: Path, alice: User
) -> None:
    receiver = receiving(procs, tmp_path, alice, "--fail-every", "3")
    for i in range(2):
        worker(procs, f"w{i}")
    ids = _ended_in_bulk(alice, 2000)
    wait_until(lambda: len(delivered_ids()) == 2000, timeout=180, interval=0.5, what="all 2,000 delivered")
    by_id = verified(receiver)
    assert {line["run_id"] for lines in by_id.values() for line in lines} == set(ids)
    assert sum(1 for line in receiver.got() if line["status"] == 500) >= 600
    assert WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING).count() == 0
