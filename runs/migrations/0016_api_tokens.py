# API tokens stored as digests (docs/design/api.md#authentication), and every Django REST framework
# token an earlier install issued turned into one: its key keeps working. DRF's table, which holds
# the keys in plain text, is then emptied, unless the project still lists `rest_framework.authtoken`
# (its own APIs may use those tokens: the operator empties it, docs/how-to/operations.md). Read and
# emptied with plain SQL, so that it works whether or not the project lists that app.
#
# Emptied for good on SQLite too: the deleted rows' bytes are overwritten (secure_delete), and once
# that is committed the write-ahead log, whose older frames still hold them, is checkpointed and
# truncated. Hence a migration that is not one transaction; its two steps each are.

import hashlib
from datetime import UTC, datetime

from django.apps import apps as installed
from django.conf import settings
from django.db import migrations, models
from django.db.models.deletion import CASCADE
from django.utils import timezone
from django.utils.dateparse import parse_datetime

DRF_TABLE = "authtoken_token"
# Each DRF token becomes its user's token of this name (DRF allowed one per user).
DRF_NAME = "migrated"
BATCH = 1000


def _aware(value: object) -> datetime:
    # A raw cursor gives what the backend stores: naive UTC on SQLite, sometimes text.
    found = value if isinstance(value, datetime) else parse_datetime(str(value))
    if found is None:
        return timezone.now()
    return found if timezone.is_aware(found) else found.replace(tzinfo=UTC)


def from_drf_tokens(apps, schema_editor):
    connection = schema_editor.connection
    if DRF_TABLE not in connection.introspection.table_names():
        return  # DRF's tokens were never installed here
    ApiToken = apps.get_model("runs", "ApiToken")
    table, key = schema_editor.quote_name(DRF_TABLE), schema_editor.quote_name("key")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {key}, user_id, created FROM {table}")
        while rows := cursor.fetchmany(BATCH):
            # The same digest as runs.models.key_digest, spelled here as migrations must.
            ApiToken.objects.bulk_create(
                ApiToken(
                    user_id=user_id,
                    name=DRF_NAME,
                    digest=hashlib.sha256(drf_key.encode()).hexdigest(),
                    created_at=_aware(created),
                )
                for drf_key, user_id, created in rows
            )
    if installed.is_installed("rest_framework.authtoken"):
        return  # the project's own: its tokens stay where its APIs read them
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("PRAGMA secure_delete")
            (secure,) = cursor.fetchone()
            cursor.execute("PRAGMA secure_delete = ON")
        cursor.execute(f"DELETE FROM {table}")
        if connection.vendor == "sqlite":
            cursor.execute(f"PRAGMA secure_delete = {int(secure)}")


def truncate_sqlite_log(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # nothing to do outside WAL mode


class Migration(migrations.Migration):
    atomic = False
    dependencies = [
        ("runs", "0015_webhook_notifications"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="ApiToken",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("name", models.CharField(max_length=64)),
                ("digest", models.CharField(editable=False, max_length=64)),
                ("created_at", models.DateTimeField()),
                ("expires_at", models.DateTimeField(blank=True, null=True)),
                ("last_used_at", models.DateTimeField(blank=True, null=True)),
                (
                    "issued_by",
                    models.ForeignKey(
                        blank=True, null=True, on_delete=CASCADE, related_name="issued", to="runs.apitoken"
                    ),
                ),
                (
                    "user",
                    models.ForeignKey(on_delete=CASCADE, related_name="api_tokens", to=settings.AUTH_USER_MODEL),
                ),
            ],
            options={
                "verbose_name": "API token",
                "ordering": ["user", "created_at"],
                "constraints": [
                    models.UniqueConstraint(fields=("digest",), name="apitoken_digest"),
                    models.UniqueConstraint(fields=("user", "name"), name="apitoken_user_name"),
                ],
            },
        ),
        # Not undone: the keys are gone from DRF's table, and a digest cannot give them back.
        migrations.RunPython(from_drf_tokens, migrations.RunPython.noop, atomic=True),
        migrations.RunPython(truncate_sqlite_log, migrations.RunPython.noop, atomic=False),
    ]
