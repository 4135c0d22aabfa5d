# Webhook endpoints, the outbox of their notifications and the log of delivery attempts
# (docs/design/webhooks.md). Written by hand, each model with its indexes and constraints in one
# CreateModel, endpoints first (the deliveries point at them).

import uuid

from django.conf import settings
from django.db import migrations, models
from django.db.models.deletion import CASCADE

ENDPOINT = [
    ("id", models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
    ("url", models.URLField(max_length=2000)),
    ("events", models.JSONField(default=list)),
    ("metadata", models.JSONField(blank=True, default=dict)),
    ("all_runs", models.BooleanField(default=False)),
    ("enabled", models.BooleanField(default=True)),
    ("disabled_reason", models.TextField(blank=True, default="")),
    ("secret", models.CharField(max_length=100)),
    ("previous_secret", models.CharField(blank=True, default="", max_length=100)),
    ("previous_secret_expires_at", models.DateTimeField(blank=True, null=True)),
    ("failing_since", models.DateTimeField(blank=True, null=True)),
    ("created_at", models.DateTimeField()),
    ("updated_at", models.DateTimeField()),
    (
        "owner",
        models.ForeignKey(on_delete=CASCADE, related_name="webhook_endpoints", to=settings.AUTH_USER_MODEL),
    ),
]

STATUSES = [("pending", "Pending"), ("delivered", "Delivered"), ("failed", "Failed")]
DELIVERY = [
    ("id", models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
    ("endpoint", models.ForeignKey(on_delete=CASCADE, related_name="deliveries", to="runs.webhookendpoint")),
    ("run_id", models.UUIDField()),
    ("seq", models.BigIntegerField()),
    ("event_type", models.CharField(max_length=64)),
    ("body", models.TextField()),
    ("status", models.CharField(choices=STATUSES, default="pending", max_length=16)),
    ("next_attempt_at", models.DateTimeField()),
    ("attempts", models.PositiveIntegerField(default=0)),
    ("created_at", models.DateTimeField()),
    ("give_up_at", models.DateTimeField()),
    ("delivered_at", models.DateTimeField(blank=True, null=True)),
    ("last_error", models.TextField(blank=True, default="")),
]

ATTEMPT = [
    ("id", models.BigAutoField(primary_key=True, serialize=False)),
    ("delivery", models.ForeignKey(on_delete=CASCADE, related_name="attempt_log", to="runs.webhookdelivery")),
    ("number", models.PositiveIntegerField()),
    ("started_at", models.DateTimeField()),
    ("duration_ms", models.PositiveIntegerField()),
    ("status_code", models.PositiveSmallIntegerField(blank=True, null=True)),
    ("response_head", models.TextField(blank=True, default="")),
    ("error", models.TextField(blank=True, default="")),
    ("worker", models.CharField(blank=True, default="", max_length=200)),
]

ENABLED = models.Q(("enabled", True))
# Its tables need only 0012's columns; it follows 0013 so that the migrations form one line.
AFTER = ("runs", "0013_run_results")


class Migration(migrations.Migration):
    dependencies = [AFTER, migrations.swappable_dependency(settings.AUTH_USER_MODEL)]
    operations = [
        migrations.CreateModel(
            name="WebhookEndpoint",
            fields=ENDPOINT,
            options={
                "ordering": ["owner", "created_at"],
                "indexes": [
                    models.Index(condition=ENABLED, fields=["owner"], name="webhook_enabled_owner"),
                    models.Index(
                        condition=models.Q(("all_runs", True), ("enabled", True)),
                        fields=["created_at"],
                        name="webhook_enabled_all",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="WebhookDelivery",
            fields=DELIVERY,
            options={
                "verbose_name_plural": "webhook deliveries",
                "ordering": ["-created_at"],
                "indexes": [
                    models.Index(
                        condition=models.Q(("status", "pending")),
                        fields=["next_attempt_at"],
                        name="webhookdelivery_due",
                    ),
                    models.Index(fields=["endpoint", "-created_at"], name="webhookdelivery_endpoint"),
                    models.Index(fields=["run_id"], name="webhookdelivery_run"),
                ],
                "constraints": [
                    models.UniqueConstraint(fields=("endpoint", "run_id", "seq"), name="webhookdelivery_once_per_event")
                ],
            },
        ),
        migrations.CreateModel(name="WebhookAttempt", fields=ATTEMPT, options={"ordering": ["delivery", "number"]}),
    ]
