"""The webhook outbox inside the fair-use limits (docs/design/webhooks.md#outbox,
docs/design/fair-use.md#limits): at most RUNLEDGER_MAX_WEBHOOKS_PER_USER endpoints, racing
registrations included; one stored body per event, counted against its run's owner, so the byte
cap refuses runs and resumes once bodies fill it; purge_runs deleting deliveries that are over with
their runs; delivery bodies in the console only for staff who may see runs; and the migration of
rows stored before bodies were shared."""

import json
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.test.utils import override_settings
from django.utils import timezone

from runs import services
from runs.exceptions import TooManyRequests
from runs.models import DeliveryStatus, Run, WebhookAttempt, WebhookDelivery, WebhookEndpoint, WebhookNotification
from runs.services.webhook_endpoints import webhook_create
from tests.factories import queued_run
from tests.support.api import api_for, assert_error
from tests.support.db import migrated_across
from tests.support.threads import race

pytestmark = pytest.mark.sqlite

URL = "https://hooks.example.test/in"
CANCELLED = ["run.cancelled"]


def register(owner: User, **more: Any) -> WebhookEndpoint:
    return webhook_create(owner=owner, url=URL, events=more.pop("events", CANCELLED), **more)


@override_settings(RUNLEDGER_MAX_WEBHOOKS_PER_USER=3)
def test_the_endpoint_past_the_cap_is_a_429_after_its_input_is_checked(alice: User, bob: User) -> None:
    for _ in range(3):
        register(alice)
    client = api_for(alice)
    body = assert_error(
        client.post("/api/webhooks/", {"url": URL, "events": CANCELLED}, format="json"), 429, "too_many_requests"
    )
    assert body["error"]["detail"] == {"webhooks": 3, "limit": 3}
    # Bad input is a 400 first, as for every cap.
    assert_error(
        client.post("/api/webhooks/", {"url": "ftp://x/", "events": CANCELLED}, format="json"), 400, "validation_error"
    )
    assert WebhookEndpoint.objects.filter(owner=alice).count() == 3
    register(bob)  # another user's cap is their own
    client.delete(f"/api/webhooks/{WebhookEndpoint.objects.filter(owner=alice).first().pk}/")
    assert client.post("/api/webhooks/", {"url": URL, "events": CANCELLED}, format="json").status_code == 201


@pytest.mark.django_db(transaction=True)
@override_settings(RUNLEDGER_MAX_WEBHOOKS_PER_USER=5)
def test_racing_registrations_never_pass_the_cap(alice: User) -> None:
    results = race(12, lambda i: register(alice))
    made = [r for r in results if isinstance(r, WebhookEndpoint)]
    refused = [r for r in results if isinstance(r, TooManyRequests)]
    assert len(made) == 5 and len(refused) == 7, results
    assert WebhookEndpoint.objects.filter(owner=alice).count() == 5


def test_one_event_to_many_endpoints_stores_one_body_counted_once_on_the_run(make_user: Any, alice: User) -> None:
    for n in range(3):
        staff = make_user(f"staff{n}", perms=("runs.view_run",))
        for _ in range(5):
            register(staff, all_runs=True)
    register(alice)
    run = queued_run(alice, input={"pad": "é" * 1000})
    stored = Run.objects.get(pk=run.pk).stored_bytes
    services.run_cancel(run_id=run.pk, actor=alice)
    notification = WebhookNotification.objects.get()
    assert WebhookDelivery.objects.filter(notification=notification).count() == 16
    assert json.loads(notification.body)["data"]["run"]["input"] == {"pad": "é" * 1000}
    ended = Run.objects.get(pk=run.pk)
    events = sum(ended.events.filter(seq__gt=run.last_seq).values_list("data_bytes", flat=True))
    assert ended.stored_bytes == stored + events + len(notification.body.encode()) == ended.ended_bytes


@override_settings(RUNLEDGER_MAX_STORED_BYTES_PER_USER=200_000)
def test_bodies_count_against_the_byte_cap_so_creates_and_resumes_are_refused_once_it_is_full(alice: User) -> None:
    pad = {"pad": "x" * 30_000}
    register(alice, events=["run.cancelled", "run.waiting"])
    # Without bodies counted, six 30 kB inputs fit in 200 kB; each cancel's body, another 30 kB, fills it at three.
    made = 0
    with pytest.raises(TooManyRequests):
        while made < 6:
            run = services.run_create(
                owner=alice, agent="demo", input=pad, start_after=timezone.now() + timedelta(hours=1)
            )
            services.run_cancel(run_id=run.pk, actor=alice)
            made += 1
    assert made == 3
    # A run that pauses and resumes over and over: each pause stores a body, and the resume that
    # would pass the cap is refused, where 100 cycles once wrote 25 MB of bodies past it.
    Run.objects.filter(owner=alice).delete()
    run = services.run_create(owner=alice, agent="demo", input=pad, start_after=timezone.now() + timedelta(hours=1))
    cycles = 0
    with pytest.raises(TooManyRequests):
        while cycles < 100:
            services.run_pause(run_id=run.pk)
            ticket = Run.objects.get(pk=run.pk).resume_ticket
            services.run_resume(run_id=run.pk, ticket=ticket, input={})
            cycles += 1
    assert 3 <= cycles <= 6, cycles
    assert WebhookNotification.objects.filter(run_id=run.pk).count() == cycles + 1


def _delivery(owner: User, status: str, *, delivered_days_ago: float | None = None) -> WebhookDelivery:
    run = queued_run(owner, start_after=timezone.now() + timedelta(hours=1))
    services.run_cancel(run_id=run.pk, actor=owner)
    delivery = WebhookDelivery.objects.get(run_id=run.pk)
    delivered_at = None if delivered_days_ago is None else timezone.now() - timedelta(days=delivered_days_ago)
    WebhookDelivery.objects.filter(pk=delivery.pk).update(status=status, delivered_at=delivered_at)
    WebhookAttempt.objects.create(delivery=delivery, number=1, started_at=timezone.now(), duration_ms=1)
    return delivery


@override_settings(RUNLEDGER_WEBHOOKS_KEEP_DAYS=7)
def test_purge_removes_deliveries_that_are_over_with_their_runs_and_keeps_pending_and_recent_ones(
    alice: User,
) -> None:
    register(alice)
    old_delivered = _delivery(alice, DeliveryStatus.DELIVERED, delivered_days_ago=8)
    given_up = _delivery(alice, DeliveryStatus.FAILED)
    pending = _delivery(alice, DeliveryStatus.PENDING)
    recent = _delivery(alice, DeliveryStatus.DELIVERED, delivered_days_ago=1)
    kept_run = _delivery(alice, DeliveryStatus.FAILED)  # its run is not purged: nor is it
    ended_long_ago = timezone.now() - timedelta(days=30)
    Run.objects.exclude(pk=kept_run.run_id).update(ended_at=ended_long_ago)
    cutoff = timezone.now() - timedelta(days=10)

    assert services.runs_purge(ended_before=cutoff, dry_run=True).runs == 4
    result = services.runs_purge(ended_before=cutoff)
    assert result.runs == 4 and result.webhook_deliveries == 2
    left = set(WebhookDelivery.objects.values_list("pk", flat=True))
    assert left == {pending.pk, recent.pk, kept_run.pk}
    assert not WebhookAttempt.objects.filter(delivery_id__in=[old_delivered.pk, given_up.pk]).exists()
    assert set(WebhookNotification.objects.values_list("run_id", flat=True)) == {
        pending.run_id,
        recent.run_id,
        kept_run.run_id,
    }
    # Once over (delivered past the days kept), a later purge takes them and their bodies.
    WebhookDelivery.objects.filter(pk__in=[pending.pk, recent.pk]).update(
        status=DeliveryStatus.DELIVERED, delivered_at=timezone.now() - timedelta(days=8)
    )
    assert services.runs_purge(ended_before=cutoff).webhook_deliveries == 2
    assert list(WebhookDelivery.objects.values_list("pk", flat=True)) == [kept_run.pk]
    assert list(WebhookNotification.objects.values_list("run_id", flat=True)) == [kept_run.run_id]


def test_delivery_bodies_in_the_console_need_the_permission_to_see_runs(make_user: Any, alice: User) -> None:
    register(alice)
    run = queued_run(alice, input={"secret_plan": "take over the world"})
    services.run_cancel(run_id=run.pk, actor=alice)
    delivery = WebhookDelivery.objects.get()
    page = f"/admin/runs/webhookdelivery/{delivery.pk}/change/"
    viewer = make_user("viewer", perms=("runs.view_webhookdelivery",), is_staff=True)
    seer = make_user("seer", perms=("runs.view_webhookdelivery", "runs.view_run"), is_staff=True)
    answers = {}
    for user in (viewer, seer):
        client = Client()
        client.force_login(user)
        answers[user.username] = client.get(page)
        assert client.get("/admin/runs/run/").status_code == (200 if user is seer else 403)
    assert answers["viewer"].status_code == 200 and "take over the world" not in answers["viewer"].content.decode()
    assert "withheld" in answers["viewer"].content.decode()
    assert "take over the world" in answers["seer"].content.decode()


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_migration_0015_stores_one_body_per_event_and_counts_it_on_the_run(alice: User) -> None:
    with migrated_across("0014_webhooks", "0015_webhook_notifications") as old:
        now = timezone.now()
        run = old.get_model("runs", "Run").objects.create(
            owner_id=alice.pk,
            agent="demo",
            input={},
            status="cancelled",
            end_code="cancelled_by_user",
            last_seq=2,
            created_at=now,
            ended_at=now,
            updated_at=now,
            stored_bytes=100,
            ended_bytes=100,
        )
        Endpoint, Delivery = old.get_model("runs", "WebhookEndpoint"), old.get_model("runs", "WebhookDelivery")
        body = json.dumps({"type": "run.cancelled", "data": {"run": {"id": str(run.pk)}}})
        for n in range(3):
            endpoint = Endpoint.objects.create(
                owner_id=alice.pk, url=f"{URL}{n}", events=CANCELLED, secret="whsec_x", created_at=now, updated_at=now
            )
            Delivery.objects.create(
                endpoint=endpoint,
                run_id=run.pk,
                seq=2,
                event_type="run.cancelled",
                body=body,
                next_attempt_at=now,
                created_at=now,
                give_up_at=now,
            )
    notification = WebhookNotification.objects.get()
    assert notification.body == body and (notification.run_id, notification.seq) == (run.pk, 2)
    assert WebhookDelivery.objects.filter(notification=notification).count() == 3
    migrated = Run.objects.get(pk=run.pk)
    assert migrated.stored_bytes == migrated.ended_bytes == 100 + len(body)
