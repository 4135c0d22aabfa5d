"""Fair use: the per-owner indexes the caps and fair claiming read (runs.services.quotas),
and the failed authentications the throttles count (runs.services.throttles)."""

from django.conf import settings
from django.db import migrations, models

OWNED = "owner"
LIVE = ["queued", "running", "waiting"]


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0004_attempt_unreleased_index"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveIndex(model_name="run", name="run_queued"),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(status="queued"), fields=[OWNED, "created_at", "id"], name="run_queued_owner"
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(condition=models.Q(status__in=LIVE), fields=[OWNED, "status"], name="run_owner_live"),
        ),
        migrations.CreateModel(
            name="AuthFailure",
            options={
                "indexes": [
                    models.Index(fields=["key", "failed_at"], name="authfailure_key_at"),
                    models.Index(fields=["failed_at"], name="authfailure_at"),
                ]
            },
            fields=[
                ("failed_at", models.DateTimeField()),
                ("key", models.CharField(max_length=64)),
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
            ],
        ),
    ]
