# Issue 34: a run's rerun_of, the run it runs again (docs/design/commands.md#rerun).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("runs", "0009_dashboard")]
    operations = [
        migrations.AddField(
            model_name="run",
            name="rerun_of",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="reruns",
                to="runs.run",
            ),
        )
    ]
