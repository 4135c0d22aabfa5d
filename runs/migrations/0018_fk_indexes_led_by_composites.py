"""Seven foreign keys lose the plain index Django gave each: an index that leads with the column
already serves them (docs/design/deployment.md#indexes). The database side is written out: Django's
own AlterField(db_index=False) drops every index on exactly that column, a partial unique one too
(runattempt_one_open_per_run), where only the foreign key's own index is to go."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

# (model, field, its target, related_name, table, column, the plain index Django made for it)
OWN_INDEXES = [
    ("apitoken", "user", settings.AUTH_USER_MODEL, "api_tokens", "runs_apitoken", "user_id",
     "runs_apitoken_user_id_3e751bd8"),
    ("idempotencyrecord", "user", settings.AUTH_USER_MODEL, "+", "runs_idempotencyrecord", "user_id",
     "runs_idempotencyrecord_user_id_95aa816f"),
    ("run", "owner", settings.AUTH_USER_MODEL, "runs", "runs_run", "owner_id", "runs_run_owner_id_b1defaec"),
    ("runattempt", "run", "runs.run", "attempts", "runs_runattempt", "run_id", "runs_runattempt_run_id_158c4b4e"),
    ("runevent", "run", "runs.run", "events", "runs_runevent", "run_id", "runs_runevent_run_id_8bd13aa7"),
    ("schedule", "owner", settings.AUTH_USER_MODEL, "schedules", "runs_schedule", "owner_id",
     "runs_schedule_owner_id_c6092fd7"),
    ("webhookdelivery", "endpoint", "runs.webhookendpoint", "deliveries", "runs_webhookdelivery", "endpoint_id",
     "runs_webhookdelivery_endpoint_id_62a9c1fb"),
]


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0017_schedules"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name=model,
                    name=field,
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name=related_name,
                        to=target,
                    ),
                )
                for model, field, target, related_name, *_ in OWN_INDEXES
            ],
            database_operations=[
                migrations.RunSQL(f"DROP INDEX IF EXISTS {name}", f"CREATE INDEX {name} ON {table} ({column})")
                for *_, table, column, name in OWN_INDEXES
            ],
        ),
    ]
