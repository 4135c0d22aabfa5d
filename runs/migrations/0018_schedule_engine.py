"""Schedules' engine (docs/design/schedules.md): the permission to schedule more often than the
minimum, the index of `buffer_one` due times waiting, what a schedule last told webhooks, and the
end code `schedule_overlap`."""

from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0017_schedules'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='schedule',
            options={'ordering': ['-created_at'], 'permissions': [('schedule_often', 'Can schedule runs more often than the minimum interval')]},
        ),
        migrations.RemoveConstraint(
            model_name='run',
            name='run_end_code_matches_status',
        ),
        migrations.AddField(
            model_name='schedule',
            name='told',
            field=models.CharField(blank=True, default='', max_length=32),
        ),
        migrations.AddIndex(
            model_name='schedule',
            index=models.Index(condition=models.Q(('buffered_due_at__isnull', False)), fields=['buffered_due_at'], name='schedule_buffered'),
        ),
        migrations.AddConstraint(
            model_name='run',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('end_code', ''), ('status', 'completed')), models.Q(('end_code__in', ['agent_error', 'invalid_output', 'storage_error', 'worker_lost']), ('status', 'failed')), models.Q(('end_code__in', ['cancelled_by_staff', 'cancelled_by_user', 'parent_cancelled', 'parent_ended', 'schedule_overlap']), ('status', 'cancelled')), models.Q(('end_code__in', ['budget_exhausted', 'deadline_exceeded', 'parent_stopped', 'policy', 'staff']), ('status', 'stopped')), models.Q(models.Q(('status__in', ['cancelled', 'completed', 'failed', 'stopped']), _negated=True), ('end_code', '')), _connector='OR'), name='run_end_code_matches_status'),
        ),
    ]
