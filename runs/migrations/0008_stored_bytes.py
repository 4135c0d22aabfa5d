# Bounded answers and storage per user. The JSON sizes of a run's input, output and error
# (a list leaves a big one out without reading it), what each run stores in all, and once ended (an
# owner's total is the sum over their runs, the ended ones' from the index `run_owner_ended`), and
# each event's data size (a page stops at its byte bound without reading past it). Existing runs
# are measured here, in SQL, in the database's own text of their JSON (PostgreSQL's has a space
# after each `:` and `,`: a little above the compact size counted from now on); existing events
# keep a null size and are measured when read.

from django.db import migrations, models

TERMINAL = ["cancelled", "completed", "failed", "stopped"]


def _measure(apps, schema_editor):
    runs = apps.get_model("runs", "Run")._meta.db_table
    events = apps.get_model("runs", "RunEvent")._meta.db_table
    if schema_editor.connection.vendor == "postgresql":
        size = "octet_length({}::text)"
    else:
        size = "length(CAST({} AS BLOB))"
    values = {
        "input": size.format("input"),
        "output": size.format("output"),
        "error": size.format("error"),
        "data": size.format("data"),
    }
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {runs} SET input_bytes = COALESCE({values['input']}, 0),"
            f" output_bytes = COALESCE({values['output']}, 0), error_bytes = COALESCE({values['error']}, 0)"
        )
        cursor.execute(
            f"UPDATE {runs} SET stored_bytes = input_bytes + output_bytes + error_bytes"
            f" + COALESCE((SELECT SUM({values['data']}) FROM {events} WHERE run_id = {runs}.id), 0)"
        )
        cursor.execute(f"UPDATE {runs} SET ended_bytes = stored_bytes WHERE status IN (%s, %s, %s, %s)", TERMINAL)


class Migration(migrations.Migration):
    dependencies = [("runs", "0007_attempt_guards")]

    operations = [
        migrations.AddField(model_name="run", name="input_bytes", field=models.PositiveIntegerField(default=0)),
        migrations.AddField(model_name="run", name="output_bytes", field=models.PositiveIntegerField(default=0)),
        migrations.AddField(model_name="run", name="error_bytes", field=models.PositiveIntegerField(default=0)),
        migrations.AddField(model_name="run", name="stored_bytes", field=models.PositiveBigIntegerField(default=0)),
        migrations.AddField(model_name="run", name="ended_bytes", field=models.PositiveBigIntegerField(default=0)),
        migrations.AddField(
            model_name="runevent", name="data_bytes", field=models.IntegerField(blank=True, null=True)
        ),
        # Before the measuring: PostgreSQL creates no index on a table with updates pending triggers
        # (the deferred foreign key checks) in the same transaction.
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("status__in", TERMINAL)), fields=["owner", "ended_bytes"], name="run_owner_ended"
            ),
        ),
        migrations.RunPython(_measure, migrations.RunPython.noop),
    ]
