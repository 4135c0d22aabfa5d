# Issue 34 item 5: a run's priority and start time, and the claim's indexes for them
# (docs/design/fair-use.md#priority).

from django.conf import settings
from django.db import migrations, models


def turns_of_live_runs(apps, schema_editor):
    # Only a live run can be queued again; an ended run's turn is never read.
    Run = apps.get_model("runs", "Run")
    Run.objects.filter(turn_at__isnull=True, status__in=["queued", "running", "waiting"]).update(
        turn_at=models.F("created_at")
    )


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0009_dashboard'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='run',
            options={'ordering': ['-created_at'], 'permissions': [('cancel_run', 'Can cancel any visible run'), ('stop_run', 'Can stop runs'), ('prioritize_run', 'Can give runs a priority above 100, claimed before fair share')]},
        ),
        migrations.RemoveIndex(
            model_name='run',
            name='run_queued_owner',
        ),
        migrations.AddField(
            model_name='run',
            name='priority',
            field=models.SmallIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='run',
            name='start_after',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='run',
            name='turn_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(turns_of_live_runs, migrations.RunPython.noop),
        migrations.AddIndex(
            model_name='run',
            index=models.Index(condition=models.Q(('status', 'queued')), fields=['owner', 'turn_at'], name='run_queued_turn'),
        ),
        migrations.AddIndex(
            model_name='run',
            index=models.Index(condition=models.Q(('status', 'queued')), fields=['owner', '-priority', 'created_at', 'id'], name='run_queued_pick'),
        ),
        migrations.AddIndex(
            model_name='run',
            index=models.Index(condition=models.Q(('priority__gt', 100), ('status', 'queued')), fields=['-priority', 'created_at', 'id'], name='run_queued_urgent'),
        ),
        migrations.AddIndex(
            model_name='run',
            index=models.Index(condition=models.Q(('start_after__isnull', False), ('status', 'queued')), fields=['start_after'], name='run_queued_start'),
        ),
        migrations.AddConstraint(
            model_name='run',
            constraint=models.CheckConstraint(condition=models.Q(('priority__gte', -100), ('priority__lte', 1000)), name='run_priority_bounded'),
        ),
    ]
