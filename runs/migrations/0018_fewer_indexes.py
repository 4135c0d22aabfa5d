"""Fewer indexes to write with each run and event (docs/design/deployment.md#indexes): seven foreign
keys lose the plain index Django gave each, since an index that leads with the column serves them;
a run's `parent` and `rerun_of`, mostly null, are indexed where set only. The database side is
written out: Django's own AlterField(db_index=False) drops every index on exactly that column, a
partial unique one too (runattempt_one_open_per_run), where only the foreign key's own is to go."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

CASCADE, SET_NULL = django.db.models.deletion.CASCADE, django.db.models.deletion.SET_NULL
USER = settings.AUTH_USER_MODEL

# (model, field, what the field is, its table and column, the plain index Django made for it)
OWN_INDEXES = [
    ("apitoken", "user", dict(on_delete=CASCADE, related_name="api_tokens", to=USER), "runs_apitoken", "user_id",
     "runs_apitoken_user_id_3e751bd8"),
    ("idempotencyrecord", "user", dict(on_delete=CASCADE, related_name="+", to=USER), "runs_idempotencyrecord",
     "user_id", "runs_idempotencyrecord_user_id_95aa816f"),
    ("run", "owner", dict(on_delete=CASCADE, related_name="runs", to=USER), "runs_run", "owner_id",
     "runs_run_owner_id_b1defaec"),
    ("run", "parent", dict(blank=True, null=True, on_delete=CASCADE, related_name="children", to="runs.run"),
     "runs_run", "parent_id", "runs_run_parent_id_8594b290"),
    ("run", "rerun_of", dict(blank=True, null=True, on_delete=SET_NULL, related_name="reruns", to="runs.run"),
     "runs_run", "rerun_of_id", "runs_run_rerun_of_id_eff6b400"),
    ("runattempt", "run", dict(on_delete=CASCADE, related_name="attempts", to="runs.run"), "runs_runattempt",
     "run_id", "runs_runattempt_run_id_158c4b4e"),
    ("runevent", "run", dict(on_delete=CASCADE, related_name="events", to="runs.run"), "runs_runevent", "run_id",
     "runs_runevent_run_id_8bd13aa7"),
    ("schedule", "owner", dict(on_delete=CASCADE, related_name="schedules", to=USER), "runs_schedule", "owner_id",
     "runs_schedule_owner_id_c6092fd7"),
    ("webhookdelivery", "endpoint", dict(on_delete=CASCADE, related_name="deliveries", to="runs.webhookendpoint"),
     "runs_webhookdelivery", "endpoint_id", "runs_webhookdelivery_endpoint_id_62a9c1fb"),
]


class Migration(migrations.Migration):
    # The user model's table is 0001's dependency already.
    dependencies = [("runs", "0017_schedules")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(model_name=model, name=name, field=models.ForeignKey(db_index=False, **field))
                for model, name, field, *_ in OWN_INDEXES
            ],
            database_operations=[
                migrations.RunSQL(f"DROP INDEX IF EXISTS {index}", f"CREATE INDEX {index} ON {table} ({column})")
                for *_, table, column, index in OWN_INDEXES
            ],
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(condition=models.Q(("parent__isnull", False)), fields=["parent"], name="run_parent"),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("rerun_of__isnull", False)), fields=["rerun_of"], name="run_rerun_of"
            ),
        ),
    ]
