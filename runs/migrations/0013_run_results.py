from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("runs", "0012_run_priority_start_after")]

    operations = [
        # Constant defaults: PostgreSQL adds such a column without rewriting the table.
        migrations.AddField(model_name="run", name="reported_usage", field=models.JSONField(blank=True, default=dict)),
        migrations.AddField(model_name="run", name="partial_events", field=models.PositiveIntegerField(default=0)),
    ]
