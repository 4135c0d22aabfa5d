# A run's metadata, and its index on PostgreSQL, written by hand per database.

from django.db import migrations, models


def _metadata_index(apps, schema_editor):
    # The list's `metadata.<key>=<value>` filters are one `metadata @> '{…}'` containment
    # (runs.selectors.run_with_metadata): a GIN index with jsonb_path_ops answers it from the index
    # at any table size, and is the smallest GIN kind for it (one hash per key-value path). SQLite
    # has no GIN: there the filter reads each candidate row's JSON.
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("CREATE INDEX run_metadata ON runs_run USING gin (metadata jsonb_path_ops)")


def _drop_metadata_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX run_metadata")


class Migration(migrations.Migration):
    dependencies = [("runs", "0009_dashboard")]
    operations = [
        # A constant default: PostgreSQL adds the column without rewriting the table.
        migrations.AddField(model_name="run", name="metadata", field=models.JSONField(blank=True, default=dict)),
        migrations.RunPython(_metadata_index, _drop_metadata_index),
    ]
