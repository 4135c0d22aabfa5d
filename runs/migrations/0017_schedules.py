"""Schedules (docs/design/schedules.md): the table, a run's schedule and due time (one run per due
time), the permission to schedule more often than the minimum, and the end code `schedule_overlap`."""

import django.db.models.deletion
import uuid
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0016_api_tokens"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="Schedule",
            fields=[
                ("id", models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ("agent", models.CharField(max_length=64)),
                ("input", models.JSONField(default=dict)),
                ("metadata", models.JSONField(blank=True, default=dict)),
                ("priority", models.SmallIntegerField(default=0)),
                ("cron", models.CharField(blank=True, default="", max_length=128)),
                ("every_seconds", models.PositiveIntegerField(blank=True, null=True)),
                ("timezone", models.CharField(default="UTC", max_length=64)),
                (
                    "overlap",
                    models.CharField(
                        choices=[
                            ("skip", "Skip"),
                            ("buffer_one", "Buffer One"),
                            ("allow_all", "Allow All"),
                            ("cancel_other", "Cancel Other"),
                        ],
                        default="skip",
                        max_length=16,
                    ),
                ),
                ("catchup_window_seconds", models.PositiveIntegerField(default=0)),
                ("start_at", models.DateTimeField(blank=True, null=True)),
                ("end_at", models.DateTimeField(blank=True, null=True)),
                ("anchor", models.DateTimeField()),
                ("paused", models.BooleanField(default=False)),
                ("next_due_at", models.DateTimeField(blank=True, null=True)),
                ("buffered_due_at", models.DateTimeField(blank=True, null=True)),
                ("told", models.CharField(blank=True, default="", max_length=32)),
                ("created_at", models.DateTimeField()),
                ("updated_at", models.DateTimeField()),
            ],
            options={
                "ordering": ["-created_at"],
                "permissions": [("schedule_often", "Can schedule runs more often than the minimum interval")],
            },
        ),
        migrations.RemoveConstraint(
            model_name="run",
            name="run_end_code_matches_status",
        ),
        migrations.AddField(
            model_name="run",
            name="schedule_due_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="schedule",
            name="last_run",
            field=models.ForeignKey(
                blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name="+", to="runs.run"
            ),
        ),
        migrations.AddField(
            model_name="schedule",
            name="owner",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE, related_name="schedules", to=settings.AUTH_USER_MODEL
            ),
        ),
        migrations.AddField(
            model_name="run",
            name="schedule",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="runs",
                to="runs.schedule",
            ),
        ),
        migrations.AddConstraint(
            model_name="run",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("end_code", ""), ("status", "completed")),
                    models.Q(
                        ("end_code__in", ["agent_error", "invalid_output", "storage_error", "worker_lost"]),
                        ("status", "failed"),
                    ),
                    models.Q(
                        (
                            "end_code__in",
                            [
                                "cancelled_by_staff",
                                "cancelled_by_user",
                                "parent_cancelled",
                                "parent_ended",
                                "schedule_overlap",
                            ],
                        ),
                        ("status", "cancelled"),
                    ),
                    models.Q(
                        (
                            "end_code__in",
                            ["budget_exhausted", "deadline_exceeded", "parent_stopped", "policy", "staff"],
                        ),
                        ("status", "stopped"),
                    ),
                    models.Q(
                        models.Q(("status__in", ["cancelled", "completed", "failed", "stopped"]), _negated=True),
                        ("end_code", ""),
                    ),
                    _connector="OR",
                ),
                name="run_end_code_matches_status",
            ),
        ),
        migrations.AddConstraint(
            model_name="run",
            constraint=models.UniqueConstraint(
                condition=models.Q(("schedule__isnull", False)),
                fields=("schedule", "schedule_due_at"),
                name="run_one_per_due_time",
            ),
        ),
        migrations.AddIndex(
            model_name="schedule",
            index=models.Index(
                condition=models.Q(("next_due_at__isnull", False), ("paused", False)),
                fields=["next_due_at"],
                name="schedule_due",
            ),
        ),
        migrations.AddIndex(
            model_name="schedule",
            index=models.Index(fields=["owner", "-created_at"], name="schedule_owner_created"),
        ),
        migrations.AddIndex(
            model_name="schedule",
            index=models.Index(
                condition=models.Q(("buffered_due_at__isnull", False)),
                fields=["buffered_due_at"],
                name="schedule_buffered",
            ),
        ),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(models.Q(("cron", ""), _negated=True), ("every_seconds__isnull", True)),
                    models.Q(("cron", ""), ("every_seconds__gt", 0)),
                    _connector="OR",
                ),
                name="schedule_cron_or_interval",
            ),
        ),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.CheckConstraint(
                condition=models.Q(("priority__gte", -100), ("priority__lte", 1000)), name="schedule_priority_bounded"
            ),
        ),
    ]
