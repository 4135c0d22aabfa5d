"""Webhooks (docs/design/webhooks.md): the endpoints users register, the outbox of notifications
written with the events they report, and the log of each delivery attempt. Data and constraints
only; the writes are runs.services.webhooks, the delivery runs.worker.webhooks.
"""

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    # Given up: past RUNLEDGER_WEBHOOKS_GIVE_UP_SECONDS without a 2xx (an admin may redeliver).
    FAILED = "failed"


class WebhookEndpoint(models.Model):
    url = models.URLField(max_length=2000)
    # The event types it is sent (runs.events.WEBHOOK_EVENTS), sorted; and only runs whose metadata
    # holds every one of the labels of `metadata`.
    events = models.JSONField(default=list)
    metadata = models.JSONField(default=dict, blank=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="webhook_endpoints")
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Every owner's runs, not only its owner's: set only by a user who sees every run.
    all_runs = models.BooleanField(default=False)
    enabled = models.BooleanField(default=True)
    # Why the platform disabled it (failing for long), for its owner; empty when they did.
    disabled_reason = models.TextField(blank=True, default="")
    # The current signing secret (`whsec_` + base64), and the one it replaced, still signed with
    # until `previous_secret_expires_at` so receivers can switch without losing a request.
    secret = models.CharField(max_length=100)
    previous_secret = models.CharField(max_length=100, blank=True, default="")
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    # Since when every attempt has failed (null after a success): disabled once it is old enough.
    failing_since = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["owner", "created_at"]
        indexes = [
            # The one read an end or a wait adds to its transaction (runs.services.webhooks.enqueue):
            # the enabled endpoints of the run's owner, and those that see every owner's runs.
            models.Index(fields=["owner"], name="webhook_enabled_owner", condition=Q(enabled=True)),
            models.Index(fields=["created_at"], name="webhook_enabled_all", condition=Q(enabled=True, all_runs=True)),
        ]

    def __str__(self) -> str:
        return self.url


class WebhookNotification(models.Model):
    """One event's notification: the request body, made once in the event's own transaction and
    sent to every endpoint it matched (their deliveries point at it). Its bytes count against the
    run's owner, on the run (docs/design/webhooks.md#outbox)."""

    id = models.BigAutoField(primary_key=True)
    # No foreign key: a purge of the run leaves what was promised to be delivered.
    run_id = models.UUIDField()
    seq = models.BigIntegerField()
    event_type = models.CharField(max_length=64)
    # Every attempt sends the same bytes, the run as the event left it.
    body = models.TextField()
    created_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run_id", "seq"], name="webhooknotification_once_per_event")]

    def __str__(self) -> str:
        return f"{self.event_type} of run {self.run_id} (seq {self.seq})"


class WebhookDelivery(models.Model):
    """One notification of one event to one endpoint: the outbox row, written in the event's own
    transaction. Its id is the `webhook-id` of every attempt to deliver it. The body is its
    notification's, shared with the event's other endpoints."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: `webhookdelivery_endpoint` leads with it (docs/design/deployment.md#indexes).
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries", db_index=False)
    # No foreign key: a purge of the run leaves what was promised to be delivered.
    run_id = models.UUIDField()
    seq = models.BigIntegerField()
    event_type = models.CharField(max_length=64)
    notification = models.ForeignKey(WebhookNotification, on_delete=models.CASCADE, related_name="deliveries")
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    # When it is due. A claim moves it past the claim's lease, so the delivery of a worker that
    # died mid-request comes due again by itself (runs.services.webhooks.deliveries_claim).
    next_attempt_at = models.DateTimeField()
    # Claims so far; a claim's number fences the writes of its outcome.
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField()
    # Past it a failed attempt is the last: the event's time plus RUNLEDGER_WEBHOOKS_GIVE_UP_SECONDS,
    # or a redelivery's.
    give_up_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "webhook deliveries"
        constraints = [
            models.UniqueConstraint(fields=["endpoint", "run_id", "seq"], name="webhookdelivery_once_per_event"),
        ]
        indexes = [
            # The claim: due pending rows, oldest due first.
            models.Index(fields=["next_attempt_at"], name="webhookdelivery_due", condition=Q(status="pending")),
            models.Index(fields=["endpoint", "-created_at"], name="webhookdelivery_endpoint"),
            models.Index(fields=["run_id"], name="webhookdelivery_run"),
        ]

    def __str__(self) -> str:
        return f"msg_{self.id.hex} {self.event_type}"

    @property
    def webhook_id(self) -> str:
        return f"msg_{self.id.hex}"


class WebhookAttempt(models.Model):
    """One POST (or its refusal before any byte was sent) of a delivery."""

    id = models.BigAutoField(primary_key=True)
    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE, related_name="attempt_log")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField()
    # Null when no answer came (refused, unreachable, timed out).
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    # The answer's first bytes (runs.worker.webhooks.RESPONSE_HEAD_BYTES), as text.
    response_head = models.TextField(blank=True, default="")
    error = models.TextField(blank=True, default="")
    worker = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["delivery", "number"]

    def __str__(self) -> str:
        return f"{self.delivery_id} attempt {self.number}"
