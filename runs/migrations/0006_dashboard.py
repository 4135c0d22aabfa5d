# The dashboard's indexes: the events' time index is written by hand, per database.

from django.db import migrations, models


def _events_by_time(apps, schema_editor):
    # The dashboard counts the last hour's events by minute. Events are appended in time order, so
    # on PostgreSQL a BRIN index finds the last hour in a few pages at any table size and costs
    # the appends almost nothing (a btree would add an insert to every event); SQLite has no BRIN.
    method = "USING brin " if schema_editor.connection.vendor == "postgresql" else ""
    schema_editor.execute(f"CREATE INDEX runevent_created ON runs_runevent {method}(created_at)")


def _drop_events_by_time(apps, schema_editor):
    schema_editor.execute("DROP INDEX runevent_created")


RUN_ENDED = models.Index(condition=models.Q(ended_at__isnull=False), fields=["ended_at"], name="run_ended")
CANCEL_RELEASED = models.Index(
    condition=models.Q(outcome__in=["cancelled", "stopped"], released_at__isnull=False),
    fields=["released_at"],
    name="runattempt_cancel_released",
)


class Migration(migrations.Migration):
    dependencies = [("runs", "0005_fair_use")]
    operations = [
        migrations.RunPython(_events_by_time, _drop_events_by_time),
        migrations.AddIndex(model_name="run", index=RUN_ENDED),
        migrations.AddIndex(model_name="runattempt", index=CANCEL_RELEASED),
    ]
