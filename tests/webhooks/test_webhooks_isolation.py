"""Webhooks no user can stall or flood, against real processes (docs/design/webhooks.md#delivery,
#outbox, #safe-requests): one user's twenty endpoints that hang or drip never hold another user's
delivery on the same worker past RUNLEDGER_WEBHOOKS_TIMEOUT_SECONDS + 5 s, before and after they
are deleted; an endpoint deleted while its deliveries are written or logged takes them all, and
breaks neither; 400 endpoints of one event cost one stored body and a few MB of the web process;
and registering a URL never waits on DNS, under a resolver that never answers."""

import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from runs import services
from runs.models import DeliveryStatus, Run, RunEvent, WebhookAttempt, WebhookDelivery, WebhookNotification
from runs.services.webhook_endpoints import webhook_create, webhook_delete
from runs.services.webhooks import Outcome, deliveries_claim, deliveries_record, enqueue
from tests.factories import queued_run
from tests.support.blackhole_dns import BlackholeDns
from tests.support.db import token_for
from tests.support.memory import memory_kb, reset_peak
from tests.support.procs import Procs, free_port, subprocess_env, wait_http_ok
from tests.support.threads import first_holds_second_waits
from tests.support.waiting import wait_until
from tests.support.webhooks import Hostile, Receiver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

TIMEOUT = 1.0
# Alice's failures come due again within a second, so her endpoints press on the worker all along.
HOSTILE_LOAD = {
    "RUNLEDGER_WEBHOOKS_ALLOW_PRIVATE": "1",
    "RUNLEDGER_WEBHOOKS_TIMEOUT_SECONDS": str(TIMEOUT),
    "RUNLEDGER_WEBHOOKS_RETRY_BASE_SECONDS": "0.2",
    "RUNLEDGER_WEBHOOKS_RETRY_MAX_SECONDS": "1",
}
BOUND = TIMEOUT + 5
LATER = timedelta(hours=1)
CANCELLED = ["run.cancelled"]


@pytest.fixture(autouse=True)
def _private_allowed(settings: object) -> None:
    settings.RUNLEDGER_WEBHOOKS_ALLOW_PRIVATE = True  # type: ignore[attr-defined]


def cancel_later_run(owner: User) -> Run:
    """A run no worker claims (its start is an hour away), cancelled: one notification per endpoint."""
    run = queued_run(owner, start_after=timezone.now() + LATER)
    return services.run_cancel(run_id=run.pk, actor=owner).run


def arrival(receiver: Receiver, run: Run) -> Callable[[], float | None]:
    def at() -> float | None:
        times = [float(str(line["at"])) for line in receiver.got() if line.get("run_id") == str(run.pk)]
        return min(times) if times else None

    return at


def delivered_within(receiver: Receiver, owner: User, what: str) -> float:
    """Cancel a run of `owner`: seconds from its commit to its notification verified at `receiver`,
    which must be within BOUND; its delivery is recorded delivered within BOUND too."""
    committed = time.time()
    run = cancel_later_run(owner)
    at = wait_until(arrival(receiver, run), timeout=BOUND + 10, interval=0.05, what=what)
    delivery = wait_until(
        lambda: WebhookDelivery.objects.filter(run_id=run.pk, status=DeliveryStatus.DELIVERED).first(),
        timeout=BOUND + 10,
        what=f"{what}, recorded",
    )
    assert delivery.delivered_at is not None
    recorded = (delivery.delivered_at - delivery.created_at).total_seconds()
    assert at - committed <= BOUND and recorded <= BOUND, (what, at - committed, recorded)
    return at - committed


@pytest.mark.sqlite
@pytest.mark.timeout(240)
def test_twenty_hanging_endpoints_of_one_user_never_hold_anothers_delivery_past_the_bound(
    procs: Procs, tmp_path: Path, alice: User, bob: User
) -> None:
    hang, drip = Hostile(procs, tmp_path, "hang"), Hostile(procs, tmp_path, "drip")
    alices = [webhook_create(owner=alice, url=hang.url(f"/hang/{i}"), events=CANCELLED) for i in range(19)]
    alices.append(webhook_create(owner=alice, url=drip.url("/drip"), events=CANCELLED))
    receiver = Receiver(procs, tmp_path)
    receiver.start([webhook_create(owner=bob, url=receiver.url(), events=CANCELLED).secret])
    # One worker, with the default RUNLEDGER_WEBHOOKS_BATCH of 20 attempts in flight.
    procs.worker("w1", concurrency=2, env=subprocess_env(**HOSTILE_LOAD))

    # Ten of Alice's runs end: 200 deliveries that hang, due again a second after each cut.
    for _ in range(10):
        cancel_later_run(alice)
    wait_until(lambda: len(hang.ended()) >= 19, timeout=30, what="Alice's requests hanging, then cut")
    latencies = []
    for i in range(4):
        latencies.append(delivered_within(receiver, bob, f"Bob's notification {i}, beside Alice's endpoints"))
        cancel_later_run(alice)  # and more of hers between his
    # The drip was cut at the deadline like the hang, though its bytes kept coming.
    drips = WebhookAttempt.objects.filter(delivery__endpoint=alices[-1])
    assert drips.exists() and all(a.error == f"no answer within {TIMEOUT}s" for a in drips)
    assert max(a.duration_ms for a in drips) < (TIMEOUT + 0.5) * 1000
    assert any(int(str(line["sent"])) >= 5 for line in drip.ended())

    # The leak case: once Alice's endpoints are gone, nothing they left behind holds Bob's.
    for endpoint in alices:
        webhook_delete(endpoint_id=endpoint.pk, user=alice)
    for i in range(3):
        latencies.append(delivered_within(receiver, bob, f"Bob's notification {i}, Alice's endpoints deleted"))
    assert max(latencies) <= BOUND, latencies


@pytest.mark.parametrize("first", ["delete", "write"])
def test_an_endpoint_deleted_while_a_notification_is_written_for_it_takes_its_delivery_or_gets_none(
    alice: User, first: str
) -> None:
    endpoint = webhook_create(owner=alice, url="http://127.0.0.1:9/in", events=CANCELLED)
    run = queued_run(alice, start_after=timezone.now() + LATER)

    def delete() -> None:
        webhook_delete(endpoint_id=endpoint.pk, user=alice)

    def write() -> None:
        services.run_cancel(run_id=run.pk, actor=alice)

    def write_held() -> None:
        # What run_cancel does under the run's lock (its own transaction cannot be held open).
        enqueue(Run.objects.select_for_update().get(pk=run.pk), "run.cancelled", now=timezone.now())

    first_holds_second_waits(*((delete, write) if first == "delete" else (write_held, delete)))
    assert first == "write" or Run.objects.get(pk=run.pk).status == "cancelled"
    assert not WebhookDelivery.objects.exists()


@pytest.mark.parametrize("first", ["delete", "log"])
def test_an_endpoint_deleted_while_a_worker_logs_an_attempt_takes_the_attempt_or_the_worker_logs_none(
    alice: User, first: str
) -> None:
    endpoint = webhook_create(owner=alice, url="http://127.0.0.1:9/in", events=CANCELLED)
    cancel_later_run(alice)
    (claimed,), _ = deliveries_claim(limit=10)
    refused = Outcome(started_at=timezone.now(), duration_ms=1, error="refused")

    def delete() -> None:
        webhook_delete(endpoint_id=endpoint.pk, user=alice)

    def log() -> None:
        deliveries_record(outcomes=[(claimed, refused)], worker="w")

    first_holds_second_waits(*((delete, log) if first == "delete" else (log, delete)))
    assert not WebhookDelivery.objects.exists() and not WebhookAttempt.objects.exists()


def test_a_notification_to_400_endpoints_stores_one_body_and_costs_the_web_process_little(
    procs: Procs, make_user: Callable[..., User], alice: User
) -> None:
    # 20 staff users, each at the cap of 20 endpoints sent every owner's runs.
    for n in range(20):
        staff = make_user(f"staff{n}", perms=("runs.view_run",))
        for i in range(20):
            webhook_create(owner=staff, url=f"http://127.0.0.1:9/{n}/{i}", events=CANCELLED, all_runs=True)
    web = procs.uvicorn(env=subprocess_env())
    headers = {"Authorization": f"Token {token_for(alice)}"}
    runs = [queued_run(alice, input={"pad": "x" * 250_000}, start_after=timezone.now() + LATER) for _ in range(2)]

    def cancel(run: Run) -> httpx.Response:
        return httpx.post(f"{web.url}/api/runs/{run.pk}/cancel/", headers=headers, timeout=60)

    assert cancel(runs[0]).status_code == 200  # the first loads what every cancel uses
    before_bytes = Run.objects.get(pk=runs[1].pk).stored_bytes
    before = memory_kb(web.pid)["VmRSS"]
    reset_peak(web.pid)
    answer = cancel(runs[1])
    growth_mb = (memory_kb(web.pid)["VmHWM"] - before) / 1024

    assert answer.status_code == 200, answer.content
    assert growth_mb < 20, f"the web process grew by {growth_mb:.1f} MB"
    notification = WebhookNotification.objects.get(run_id=runs[1].pk)
    assert len(notification.body) > 250_000
    assert WebhookDelivery.objects.filter(notification=notification).count() == 400
    # Counted once, on the run, as an event is.
    ended = Run.objects.get(pk=runs[1].pk)
    events = sum(RunEvent.objects.filter(run=ended, seq__gt=runs[1].last_seq).values_list("data_bytes", flat=True))
    assert ended.stored_bytes == before_bytes + events + len(notification.body) == ended.ended_bytes


@pytest.mark.timeout(120)
def test_registering_a_url_never_waits_on_dns_under_a_resolver_that_never_answers(
    procs: Procs, tmp_path: Path, alice: User, bob: User
) -> None:
    name = "hooks.never-answers.test"
    with BlackholeDns(tmp_path) as dns:
        # The rig holds: a lookup under it blocks (the C resolver waits 30 s for each of two tries).
        lookup = [sys.executable, "-c", f"import socket; socket.getaddrinfo({name!r}, 443)"]
        with pytest.raises(subprocess.TimeoutExpired):
            subprocess.run(dns.under(lookup), timeout=3, capture_output=True)
        assert dns.queries >= 1
        port = free_port()
        args = [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port)]
        web = procs.start("uvicorn-blackhole-dns", dns.under([*args, "--log-level", "warning"]), subprocess_env(), port)
        wait_http_ok(web, "/healthz/", timeout=30)
        headers = {"Authorization": f"Token {token_for(alice)}"}
        bobs = {"Authorization": f"Token {token_for(bob)}"}
        queries_before = dns.queries

        def register(i: int) -> tuple[int, float]:
            began = time.monotonic()
            body = {"url": f"https://{i}.{name}/in", "events": CANCELLED}
            answer = httpx.post(f"{web.url}/api/webhooks/", json=body, headers=headers, timeout=60)
            return answer.status_code, time.monotonic() - began

        # More at once than the web process has threads waiting on nothing else.
        with ThreadPoolExecutor(20) as pool:
            registered = list(pool.map(register, range(20)))
            began = time.monotonic()
            listed = httpx.get(f"{web.url}/api/runs/", headers=bobs, timeout=60)
            other = time.monotonic() - began
    # A lookup would hold each for a minute (two tries of 30 s): what time they took is the machine's.
    assert [status for status, _ in registered] == [201] * 20
    assert max(seconds for _, seconds in registered) < 10, registered
    assert listed.status_code == 200 and other < 10
    assert dns.queries == queries_before  # the web process asked DNS nothing
