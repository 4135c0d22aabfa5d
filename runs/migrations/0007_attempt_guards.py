# The `storage_error` end code; when a queued run entered the queue (queue age); where an
# attempt's tool processes run (killed once the attempt is lost), and the index a starting worker
# finds them by; the cancel -> released latencies count attempts a sweeper marked lost.

from django.db import migrations, models
from django.db.models import F


def _queued_since(apps, schema_editor):
    # A queued run's last entry into the queue is at latest its last change; others keep null
    # until they enter it again.
    Run = apps.get_model("runs", "Run")
    Run.objects.filter(status="queued").update(queued_at=F("updated_at"))


class Migration(migrations.Migration):
    dependencies = [("runs", "0006_dashboard")]

    operations = [
        migrations.RemoveConstraint(
            model_name="run",
            name="run_end_code_matches_status",
        ),
        migrations.AddField(
            model_name="run",
            name="queued_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="runattempt",
            name="machine",
            field=models.CharField(blank=True, default="", max_length=100),
        ),
        migrations.AddField(
            model_name="runattempt",
            name="process_groups",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.RunPython(_queued_since, migrations.RunPython.noop),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(condition=models.Q(("status", "queued")), fields=["queued_at"], name="run_queued_at"),
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
                            ["cancelled_by_staff", "cancelled_by_user", "parent_cancelled", "parent_ended"],
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
        migrations.RemoveIndex(
            model_name='runattempt',
            name='runattempt_cancel_released',
        ),
        migrations.AddIndex(
            model_name='runattempt',
            index=models.Index(condition=models.Q(('outcome__in', ['cancelled', 'lost', 'stopped']), ('released_at__isnull', False)), fields=['released_at'], name='runattempt_cancel_released'),
        ),
        migrations.AddIndex(
            model_name='runattempt',
            index=models.Index(condition=models.Q(('outcome', 'lost'), models.Q(('process_groups', []), _negated=True)), fields=['machine'], name='runattempt_lost_groups'),
        ),
    ]
