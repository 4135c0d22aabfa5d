"""Webhooks in process (docs/design/webhooks.md): endpoints through the API, the outbox written in
the event's own transaction, the claim's lease and fence, signing, and the refusal of private
addresses at registration and at connect time. The deliveries to a receiver in its own process
are tests/webhooks/test_webhooks_delivery.py."""

import asyncio
import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from runs import services
from runs.models import DeliveryStatus, Run, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from runs.services.webhooks import Outcome, deliveries_claim, deliveries_redeliver, delivery_record, retry_delay
from runs.worker.webhooks import post, sign
from tests.factories import queued_run, running_run
from tests.support.api import api_for, assert_error

pytestmark = pytest.mark.sqlite

PUBLIC = "hooks.example.test=93.184.216.34"
URL = "https://hooks.example.test/in"
ALL_EVENTS = ["run.cancelled", "run.completed", "run.failed", "run.stopped", "run.waiting"]


@pytest.fixture(autouse=True)
def _public_name(settings: object) -> None:
    settings.RUNLEDGER_WEBHOOKS_RESOLVE_OVERRIDES = [PUBLIC]  # type: ignore[attr-defined]


def register(user: User, **body: object) -> dict[str, object]:
    response = api_for(user).post("/api/webhooks/", {"url": URL, "events": ALL_EVENTS, **body}, format="json")
    assert response.status_code == 201, response.content
    return dict(response.json())


def test_register_shows_the_secret_once_and_only_to_its_owner(alice: User, bob: User) -> None:
    created = register(alice, metadata={"team": "a"})
    assert str(created["secret"]).startswith("whsec_")
    assert created["events"] == ALL_EVENTS and created["metadata"] == {"team": "a"} and created["enabled"] is True
    read = api_for(alice).get(f"/api/webhooks/{created['id']}/").json()
    assert "secret" not in read and read["id"] == created["id"]
    assert [e["id"] for e in api_for(alice).get("/api/webhooks/").json()["results"]] == [created["id"]]
    assert api_for(bob).get("/api/webhooks/").json()["results"] == []
    assert_error(api_for(bob).get(f"/api/webhooks/{created['id']}/"), 404, "not_found")
    assert_error(api_for(bob).delete(f"/api/webhooks/{created['id']}/"), 404, "not_found")
    changed = api_for(alice).patch(f"/api/webhooks/{created['id']}/", {"events": ["run.failed"]}, format="json")
    assert changed.status_code == 200 and changed.json()["events"] == ["run.failed"]
    assert api_for(alice).delete(f"/api/webhooks/{created['id']}/").status_code == 204
    assert not WebhookEndpoint.objects.exists()


@pytest.mark.parametrize(
    ("url", "field"),
    [
        ("http://127.0.0.1:8000/x", "url"),
        ("http://10.1.2.3/x", "url"),
        ("http://169.254.169.254/latest/meta-data/", "url"),
        ("http://[::1]/x", "url"),
        ("ftp://hooks.example.test/x", "url"),
    ],
)
def test_a_private_or_odd_url_is_a_400_naming_url(alice: User, url: str, field: str) -> None:
    body = assert_error(
        api_for(alice).post("/api/webhooks/", {"url": url, "events": ["run.failed"]}, format="json"),
        400,
        "validation_error",
    )
    assert field in body["error"]["detail"]
    assert not WebhookEndpoint.objects.exists()


def test_bad_events_and_all_runs_without_the_permission_are_refused(alice: User) -> None:
    body = assert_error(
        api_for(alice).post("/api/webhooks/", {"url": URL, "events": ["run.created"]}, format="json"),
        400,
        "validation_error",
    )
    assert "events" in body["error"]["detail"]
    assert_error(
        api_for(alice).post("/api/webhooks/", {"url": URL, "events": ["run.failed"], "all_runs": True}, format="json"),
        403,
        "permission_denied",
    )
    assert not WebhookEndpoint.objects.exists()


def test_an_end_writes_a_notification_in_its_own_transaction(alice: User, bob: User) -> None:
    endpoint = register(alice, events=["run.cancelled"])
    run = running_run(alice)
    services.run_cancel(run_id=run.pk, actor=alice, note="enough")
    delivery = WebhookDelivery.objects.get()
    run.refresh_from_db()
    assert (str(delivery.endpoint_id), delivery.run_id, delivery.seq) == (endpoint["id"], run.pk, run.last_seq)
    body = json.loads(delivery.notification.body)
    assert body["type"] == "run.cancelled" and body["data"]["run"]["id"] == str(run.pk)
    assert body["data"]["run"]["status"] == "cancelled" and body["data"]["run"]["attempt"]["outcome"] == "cancelled"
    assert "resume_ticket" not in body["data"]["run"]
    # Bob's run, an event the endpoint did not ask for, a rolled-back end: nothing.
    services.run_cancel(run_id=queued_run(bob).pk, actor=bob)
    other = running_run(alice)
    services.run_fail(run_id=other.pk, generation=other.generation, code="agent_error", reason="no")
    rolled_back = queued_run(alice)
    with pytest.raises(RuntimeError), transaction.atomic():
        services.run_cancel(run_id=rolled_back.pk, actor=alice)
        raise RuntimeError("rolled back")
    assert WebhookDelivery.objects.count() == 1


def test_a_notifications_run_is_the_apis_run_json_byte_for_byte_but_the_ticket(alice: User) -> None:
    register(alice, events=["run.waiting", "run.cancelled"])
    api = api_for(alice)
    paused = queued_run(alice, metadata={"client": "café ☕"})
    services.run_pause(run_id=paused.pk)
    waiting = api.get(f"/api/runs/{paused.pk}/").json()
    running = running_run(alice)
    services.run_cancel(run_id=running.pk, actor=alice, note="n'importe: « quoi »")
    cancelled = api.get(f"/api/runs/{running.pk}/").json()
    bodies = [d.notification.body for d in WebhookDelivery.objects.order_by("created_at")]
    assert [json.loads(body)["type"] for body in bodies] == ["run.waiting", "run.cancelled"]
    # The owner sees the ticket (null once the run ended); a notification never carries the field.
    assert waiting.pop("resume_ticket") and cancelled.pop("resume_ticket") is None
    assert cancelled["attempt"]["outcome"] == "cancelled" and cancelled["end_reason"] == "n'importe: « quoi »"
    for body, answer in zip(bodies, [waiting, cancelled], strict=True):
        assert body.endswith('"data":{"run":' + json.dumps(answer, separators=(",", ":")) + "}}")


def test_the_metadata_filter_and_a_disabled_endpoint(alice: User) -> None:
    register(alice, metadata={"team": "a"})
    off = register(alice)
    api_for(alice).patch(f"/api/webhooks/{off['id']}/", {"enabled": False}, format="json")
    services.run_cancel(run_id=queued_run(alice, metadata={"team": "b"}).pk, actor=alice)
    assert not WebhookDelivery.objects.exists()
    services.run_cancel(run_id=queued_run(alice, metadata={"team": "a", "x": "y"}).pk, actor=alice)
    assert WebhookDelivery.objects.count() == 1


def test_staff_endpoints_for_all_runs(make_user: object, alice: User) -> None:
    staff = make_user("staff", perms=("runs.view_run",))  # type: ignore[operator]
    register(staff, all_runs=True, events=["run.cancelled"])
    services.run_cancel(run_id=queued_run(alice).pk, actor=alice)
    assert WebhookDelivery.objects.get().endpoint.owner == staff
    # The permission taken away: nothing more is sent, and the endpoint says why.
    staff.user_permissions.clear()
    assert deliveries_claim(limit=10)[0] == []
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.enabled is False and "runs.view_run" in endpoint.disabled_reason


def test_a_cancel_with_no_endpoint_reads_once_and_writes_nothing(alice: User, bob: User) -> None:
    register(bob)  # another owner's endpoint: not a match
    run = queued_run(alice)
    with CaptureQueriesContext(connection) as queries:
        services.run_cancel(run_id=run.pk, actor=alice)
    touching = [q["sql"] for q in queries.captured_queries if "runs_webhook" in q["sql"]]
    assert len(touching) == 1 and touching[0].lstrip().upper().startswith("SELECT"), touching


def test_a_claim_is_a_lease_and_only_the_current_claim_settles(alice: User, settings: object) -> None:
    settings.RUNLEDGER_WEBHOOKS_TIMEOUT_SECONDS = 0.5  # type: ignore[attr-defined]  # a lease of 2 s
    register(alice)
    services.run_cancel(run_id=queued_run(alice).pk, actor=alice)
    (first,), _ = deliveries_claim(limit=10)
    assert deliveries_claim(limit=10)[0] == []  # leased: nobody else takes it
    # The first claimant is gone (killed mid-request): once its lease lapses, the row is due again.
    WebhookDelivery.objects.update(next_attempt_at=timezone.now() - timedelta(seconds=1))
    (second,), _ = deliveries_claim(limit=10)
    assert (second.webhook_id, second.number) == (first.webhook_id, 2)
    failed = Outcome(started_at=timezone.now(), duration_ms=5, status_code=500)
    delivery_record(claimed=first, outcome=failed, worker="late")  # stale: logged, nothing else
    assert WebhookDelivery.objects.get().status == DeliveryStatus.PENDING
    delivery_record(claimed=second, outcome=failed, worker="w")
    row = WebhookDelivery.objects.get()
    retry_in = (row.next_attempt_at - timezone.now()).total_seconds()
    assert row.status == DeliveryStatus.PENDING and 0 < retry_in <= 15 and row.last_error == "HTTP 500"
    assert row.endpoint.failing_since is not None
    assert list(WebhookAttempt.objects.order_by("id").values_list("number", "status_code")) == [(1, 500), (2, 500)]
    row.next_attempt_at = timezone.now()
    row.save()
    (third,), _ = deliveries_claim(limit=10)
    delivery_record(
        claimed=third, outcome=Outcome(started_at=timezone.now(), duration_ms=5, status_code=204), worker="w"
    )
    row.refresh_from_db()
    assert row.status == DeliveryStatus.DELIVERED and row.endpoint.failing_since is None


def test_the_first_retry_comes_within_ten_seconds_and_later_ones_back_off() -> None:
    first = [retry_delay(1) for _ in range(1000)]
    assert min(first) >= 2.5 and max(first) <= 7.5  # RUNLEDGER_WEBHOOKS_RETRY_BASE_SECONDS 5, jittered
    assert len(set(first)) > 990  # jittered: retries that failed together spread out
    assert min(retry_delay(5) for _ in range(100)) >= 40


@pytest.mark.parametrize(("base", "most"), [(5, 3600), (0.2, 1), (7, 10), (1000, 600)])
def test_no_retry_waits_longer_than_the_maximum_at_any_attempt(settings: object, base: float, most: float) -> None:
    settings.RUNLEDGER_WEBHOOKS_RETRY_BASE_SECONDS = base  # type: ignore[attr-defined]
    settings.RUNLEDGER_WEBHOOKS_RETRY_MAX_SECONDS = most  # type: ignore[attr-defined]
    # Every attempt a delivery can reach (the exponent stops growing at 30), many draws each: the
    # jitter is applied before the cap, so the cap is never passed, and waits below it still spread.
    waits = {number: [retry_delay(number) for _ in range(200)] for number in range(1, 40)}
    assert max(max(each) for each in waits.values()) <= most
    assert min(min(each) for each in waits.values()) >= min(base, most) / 2
    below = [wait for wait in waits[1] if wait < most]
    assert len(set(below)) == len(below)


def test_past_its_give_up_time_a_delivery_fails_and_a_long_failing_endpoint_is_disabled(
    alice: User, settings: object
) -> None:
    settings.RUNLEDGER_WEBHOOKS_DISABLE_AFTER_SECONDS = 0  # type: ignore[attr-defined]
    register(alice)
    services.run_cancel(run_id=queued_run(alice).pk, actor=alice)
    WebhookDelivery.objects.update(give_up_at=timezone.now())
    (claimed,), _ = deliveries_claim(limit=10)
    delivery_record(
        claimed=claimed, outcome=Outcome(started_at=timezone.now(), duration_ms=1, error="refused"), worker="w"
    )
    row = WebhookDelivery.objects.select_related("endpoint").get()
    assert row.status == DeliveryStatus.FAILED and row.last_error == "refused"
    assert row.endpoint.enabled is False and "refused" in row.endpoint.disabled_reason
    shown = api_for(alice).get(f"/api/webhooks/{row.endpoint_id}/").json()
    assert shown["enabled"] is False and "refused" in shown["disabled_reason"]
    listed = api_for(alice).get(f"/api/webhooks/{row.endpoint_id}/deliveries/").json()["results"]
    assert [(d["id"], d["status"]) for d in listed] == [(row.webhook_id, "failed")]
    assert deliveries_redeliver(ids=[row.id]) == 1
    assert WebhookDelivery.objects.get().status == DeliveryStatus.PENDING


def test_signatures_verify_with_the_standardwebhooks_package_through_a_rotation(alice: User) -> None:
    created = register(alice)
    old = str(created["secret"])
    rotated = api_for(alice).post(f"/api/webhooks/{created['id']}/rotate-secret/").json()
    new = str(rotated["secret"])
    assert new != old and rotated["previous_secret_expires_at"] is not None
    services.run_cancel(run_id=queued_run(alice).pk, actor=alice)
    (claimed,), _ = deliveries_claim(limit=10)
    assert claimed.secrets == (new, old)
    now = timezone.now()
    headers = {
        "webhook-id": claimed.webhook_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": sign(claimed.secrets, claimed.webhook_id, int(now.timestamp()), claimed.body),
    }
    for secret in (old, new):
        assert Webhook(secret).verify(claimed.body, headers)["type"] == "run.cancelled"
    with pytest.raises(WebhookVerificationError):
        Webhook(f"whsec_{'A' * 32}").verify(claimed.body, headers)
    # Once the overlap has passed, only the new secret signs.
    WebhookEndpoint.objects.update(previous_secret_expires_at=now)
    WebhookDelivery.objects.update(next_attempt_at=now)
    (again,), _ = deliveries_claim(limit=10)
    assert again.secrets == (new,)


def test_a_name_that_resolves_to_a_private_address_after_registration_is_refused_at_connect(
    alice: User, settings: object
) -> None:
    register(alice)
    services.run_cancel(run_id=queued_run(alice).pk, actor=alice)
    (claimed,), _ = deliveries_claim(limit=10)
    for private in ("10.0.0.7", "127.0.0.1", "169.254.169.254", "::1"):
        settings.RUNLEDGER_WEBHOOKS_RESOLVE_OVERRIDES = [f"hooks.example.test={private}"]  # type: ignore[attr-defined]

        async def send() -> Outcome:
            return await post(claimed, timeout=2)

        outcome = asyncio.run(send())
        assert outcome.status_code is None and outcome.error.startswith("refused:"), outcome
        # The owner of the URL is not told what the name resolves to inside the network.
        assert private not in outcome.error and "hooks.example.test resolves to a refused address" in outcome.error


def test_a_run_waiting_is_notified(alice: User) -> None:
    register(alice, events=["run.waiting"])
    run = running_run(alice)
    services.run_wait(run_id=run.pk, generation=run.generation, reason="input_required", prompt="name?")
    body = json.loads(WebhookDelivery.objects.get().notification.body)
    assert body["type"] == "run.waiting" and body["data"]["run"]["status"] == "waiting"
    assert Run.objects.get(pk=run.pk).status == "waiting"


def test_the_console_lists_deliveries_per_endpoint_and_per_run_and_redelivers(
    alice: User, admin_client: object, settings: object
) -> None:
    settings.RUNLEDGER_WEBHOOKS_DISABLE_AFTER_SECONDS = 0  # type: ignore[attr-defined]
    created = register(alice)
    run = queued_run(alice)
    services.run_cancel(run_id=run.pk, actor=alice)
    (claimed,), _ = deliveries_claim(limit=10)
    failed = Outcome(started_at=timezone.now(), duration_ms=3, status_code=503, response_head="busy")
    delivery_record(claimed=claimed, outcome=failed, worker="w9")
    delivery = WebhookDelivery.objects.get()
    client = admin_client  # a superuser's
    listed = client.get(f"/admin/runs/webhookdelivery/?run_id={run.pk}")  # type: ignore[attr-defined]
    assert listed.status_code == 200 and delivery.webhook_id in listed.content.decode()
    elsewhere = client.get(f"/admin/runs/webhookdelivery/?endpoint__id__exact={created['id']}")  # type: ignore[attr-defined]
    assert elsewhere.status_code == 200 and delivery.webhook_id in elsewhere.content.decode()
    page = client.get(f"/admin/runs/webhookdelivery/{delivery.pk}/change/").content.decode()  # type: ignore[attr-defined]
    assert "busy" in page and "w9" in page
    endpoint_page = client.get(f"/admin/runs/webhookendpoint/{created['id']}/change/").content.decode()  # type: ignore[attr-defined]
    assert str(created["secret"]) not in endpoint_page
    answer = client.post(  # type: ignore[attr-defined]
        "/admin/runs/webhookdelivery/", {"action": "redeliver", "_selected_action": [str(delivery.pk)]}
    )
    assert answer.status_code == 302
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.PENDING and delivery.next_attempt_at <= timezone.now()
    dashboard = client.get("/admin/runs/dashboard/?figures=1").content.decode()  # type: ignore[attr-defined]
    assert f'data-failing-webhook="{created["id"]}"' in dashboard
    metrics = client.get("/metrics/").content.decode()  # type: ignore[attr-defined]
    assert "runledger_webhooks_oldest_pending_age_seconds" in metrics
    assert 'runledger_webhook_deliveries_total{outcome="failure"}' in metrics


def test_a_claim_serves_owners_in_turns_counting_what_they_have_in_flight(alice: User, bob: User) -> None:
    alices = [register(alice, events=["run.cancelled"]) for _ in range(5)]
    for _ in range(4):
        services.run_cancel(run_id=queued_run(alice).pk, actor=alice)  # 20 of hers due, oldest first
    register(bob, events=["run.cancelled"])
    services.run_cancel(run_id=queued_run(bob).pk, actor=bob)  # his, due last
    # Alice's first turn is her oldest, then Bob's first, then her second (on another endpoint).
    first = deliveries_claim(limit=3)[0]
    assert [c.owner_id for c in first] == [alice.pk, bob.pk, alice.pk]
    assert first[0].endpoint_id != first[2].endpoint_id and {str(c.endpoint_id) for c in first} & {
        str(e["id"]) for e in alices
    }
    # Bob's taken: a worker with Alice's in flight serves whoever has fewer, even with one slot.
    services.run_cancel(run_id=queued_run(bob).pk, actor=bob)
    (next_one,), _ = deliveries_claim(limit=1, busy={alice.pk: 2})
    assert next_one.owner_id == bob.pk
