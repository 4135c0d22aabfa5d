# A notification's body stored once per event, not once per endpoint (docs/design/webhooks.md#outbox):
# the deliveries of one event point at one WebhookNotification. Existing rows are moved: one
# notification per (run, seq) with the body its deliveries carried (made once, they were the same
# bytes), and its bytes counted on the run, if it is still kept, as new ones are.

from typing import Any

from django.db import migrations, models
from django.db.models import F
from django.db.models.deletion import CASCADE

NOTIFICATION = [
    ("id", models.BigAutoField(primary_key=True, serialize=False)),
    ("run_id", models.UUIDField()),
    ("seq", models.BigIntegerField()),
    ("event_type", models.CharField(max_length=64)),
    ("body", models.TextField()),
    ("created_at", models.DateTimeField()),
]
TERMINAL = ["completed", "failed", "cancelled", "stopped"]


def one_body_per_event(apps: Any, schema_editor: Any) -> None:
    delivery = apps.get_model("runs", "WebhookDelivery")
    notification = apps.get_model("runs", "WebhookNotification")
    run = apps.get_model("runs", "Run")
    events = delivery.objects.values_list("run_id", "seq").distinct().order_by("run_id", "seq")
    for run_id, seq in events.iterator():
        first = delivery.objects.filter(run_id=run_id, seq=seq).order_by("created_at", "id").first()
        made = notification.objects.create(
            run_id=run_id, seq=seq, event_type=first.event_type, body=first.body, created_at=first.created_at
        )
        delivery.objects.filter(run_id=run_id, seq=seq).update(notification=made)
        size = len(first.body.encode())
        kept = run.objects.filter(pk=run_id)
        kept.update(stored_bytes=F("stored_bytes") + size)
        kept.filter(status__in=TERMINAL).update(ended_bytes=F("ended_bytes") + size)


def bodies_back(apps: Any, schema_editor: Any) -> None:
    delivery = apps.get_model("runs", "WebhookDelivery")
    for made in apps.get_model("runs", "WebhookNotification").objects.iterator():
        delivery.objects.filter(notification=made).update(body=made.body)


class Migration(migrations.Migration):
    dependencies = [("runs", "0014_webhooks")]
    operations = [
        migrations.CreateModel(
            name="WebhookNotification",
            fields=NOTIFICATION,
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("run_id", "seq"), name="webhooknotification_once_per_event")
                ]
            },
        ),
        migrations.AddField(
            model_name="webhookdelivery",
            name="notification",
            field=models.ForeignKey(
                null=True, on_delete=CASCADE, related_name="deliveries", to="runs.webhooknotification"
            ),
        ),
        migrations.RunPython(one_body_per_event, bodies_back),
        # A default first, so that going back adds the column to rows that exist (then filled).
        migrations.AlterField(model_name="webhookdelivery", name="body", field=models.TextField(default="")),
        migrations.RemoveField(model_name="webhookdelivery", name="body"),
        migrations.AlterField(
            model_name="webhookdelivery",
            name="notification",
            field=models.ForeignKey(on_delete=CASCADE, related_name="deliveries", to="runs.webhooknotification"),
        ),
    ]
