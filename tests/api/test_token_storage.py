"""What a database dump holds of API tokens (docs/security.md#credentials): no key that was ever
issued — by `manage.py create_token`, by the API, by the admin, or by Django REST framework before
the migration that turned its tokens into digests, whose keys keep working. `pg_dump` of the test
database on PostgreSQL; the database file and its journals, byte for byte, on SQLite."""

import io
import re
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader
from django.test import Client

from runs.models import ApiToken, key_digest
from tests.support.db import database_dump, drf_token_model

pytestmark = [pytest.mark.sqlite, pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

DRF_KEY = "0123456789abcdef0123456789abcdef01234567"  # DRF's shape: 40 hex digits


def the_migration() -> tuple[tuple[str, str], tuple[str, str]]:
    """(the migration that turns DRF's tokens into digests, the one before it), by name: the
    numbers may change as migrations are added."""
    loader = MigrationLoader(connection)
    [name] = [name for app, name in loader.disk_migrations if app == "runs" and name.endswith("_api_tokens")]
    migration = loader.disk_migrations[("runs", name)]
    [before] = [dependency for dependency in migration.dependencies if dependency[0] == "runs"]
    return ("runs", name), before


@pytest.fixture
def migrated_drf_token(alice: User) -> Iterator[str]:
    """A key DRF issued to Alice before the migration, which has run since."""
    target, before = the_migration()
    MigrationExecutor(connection).migrate([before])
    drf_token = drf_token_model()
    try:
        with connection.schema_editor() as editor:
            editor.create_model(drf_token)
        drf_token.objects.create(key=DRF_KEY, user_id=alice.pk, created=datetime(2024, 5, 1, 12, 0, tzinfo=UTC))
        MigrationExecutor(connection).migrate([target])
        assert not drf_token.objects.exists()  # emptied: the project lists no DRF token app
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
        yield DRF_KEY
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
        with connection.schema_editor() as editor:
            editor.delete_model(drf_token)


def works(key: str) -> bool:
    return Client(HTTP_AUTHORIZATION=f"Token {key}").get("/api/runs/").status_code == 200


def test_a_token_drf_issued_before_the_migration_still_authenticates_as_its_user(
    migrated_drf_token: str, alice: User
) -> None:
    token = ApiToken.objects.get()
    assert (token.user, token.name, token.digest) == (alice, "migrated", key_digest(migrated_drf_token))
    assert token.created_at == datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    answer = Client(HTTP_AUTHORIZATION=f"Token {migrated_drf_token}").get("/api/tokens/")
    assert answer.status_code == 200 and [t["name"] for t in answer.json()["results"]] == ["migrated"]


def test_no_database_dump_holds_a_key_issued_by_any_means(migrated_drf_token: str, alice: User) -> None:
    out = io.StringIO()
    call_command("create_token", "alice", "--name", "cli", stdout=out, stderr=io.StringIO())
    by_command = out.getvalue().strip()
    browser = Client()
    browser.force_login(alice)
    by_api = browser.post("/api/tokens/", {"name": "api"}, content_type="application/json").json()["key"]
    root = Client()
    root.force_login(User.objects.create_superuser("root", password="pw-for-tests"))
    page = root.post("/admin/runs/apitoken/add/", {"user": alice.pk, "name": "admin"})
    found = re.search(r'<code id="rl-token-key">([^<]+)</code>', page.content.decode())
    assert found is not None, page.content.decode()
    by_admin = found.group(1)

    keys = {"migrated": migrated_drf_token, "cli": by_command, "api": by_api, "admin": by_admin}
    assert all(works(key) for key in keys.values())  # real keys, each used once (its last use noted)
    dump = database_dump()
    for name, key in keys.items():
        # Booleans, so that a failure does not print the dump.
        digest_held, key_held = key_digest(key).encode() in dump, key.encode() in dump
        assert digest_held, f"the dump holds no digest of {name}: not a dump of the tokens"
        assert not key_held, f"the dump holds the key of the token {name}"
