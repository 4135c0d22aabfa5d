# A run's rerun_of, the run it runs again (docs/design/commands.md#rerun). SET_NULL, so
# purging an original leaves its reruns.

from django.db import migrations, models

rerun_of = models.ForeignKey(
    "runs.run", models.SET_NULL, blank=True, null=True, related_name="reruns"
)


class Migration(migrations.Migration):
    dependencies = [("runs", "0010_run_metadata")]
    operations = [migrations.AddField("run", "rerun_of", rerun_of)]
