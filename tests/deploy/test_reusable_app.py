"""`runs` as an app of any project: its API keeps its own DRF behaviour whatever the
project's REST_FRAMEWORK says, it refuses a SQLite database without the two options it needs, its
URLs come in groups under one namespace, and it changes no other app's admin unless asked.
tests/deploy/test_host.py proves the whole of it in a project made by `django-admin startproject`."""

import json
from pathlib import Path
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import Client
from django.test.utils import override_settings
from django.urls import reverse

from runs.admin.hardening import HardenedAdmin
from runs.conf import sqlite_problems
from runs.urls import api, operations, pages, parts
from tests.support.api import assert_error
from tests.support.db import token_for
from tests.support.package import in_a_bare_host

# A project's REST_FRAMEWORK that would change every default an API could take from it.
HOSTILE_REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.BasicAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.AllowAny"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.FormParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.BrowsableAPIRenderer"],
    "EXCEPTION_HANDLER": "rest_framework.views.exception_handler",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 2,
    "DEFAULT_THROTTLE_CLASSES": ["rest_framework.throttling.UserRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"user": "1/day"},
    "DEFAULT_VERSIONING_CLASS": "rest_framework.versioning.QueryParameterVersioning",
    "DEFAULT_SCHEMA_CLASS": "rest_framework.schemas.openapi.AutoSchema",
}


@pytest.mark.sqlite
@pytest.mark.timeout(60)
@override_settings(REST_FRAMEWORK=HOSTILE_REST_FRAMEWORK)
def test_the_api_keeps_its_behaviour_whatever_the_projects_rest_framework_says(alice: User) -> None:
    client = Client()
    assert_error(client.get("/api/runs/"), 401, "not_authenticated")
    token = {"HTTP_AUTHORIZATION": f"Token {token_for(alice)}"}
    for n in range(3):
        created = client.post(
            "/api/runs/", json.dumps({"agent": "demo", "input": {"deltas": n + 1}}), "application/json", **token
        )
        assert created.status_code == 201, created.content
        assert created["Content-Type"] == "application/json"
    assert_error(
        client.post("/api/runs/", "agent=demo", "application/x-www-form-urlencoded", **token),
        415,
        "unsupported_media_type",
    )
    listed = client.get("/api/runs/", **token)  # a second request: no throttle of the project's
    assert listed.status_code == 200
    assert set(listed.json()) == {"next", "previous", "results"} and len(listed.json()["results"]) == 3
    schema = client.get("/api/schema/", {"format": "json"})
    assert schema.status_code == 200
    assert "/api/runs/{run_id}/stream/" in schema.json()["paths"]


@pytest.mark.sqlite
@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("options", "missing"),
    [
        ({}, ['"transaction_mode": "IMMEDIATE"', '"timeout"']),
        ({"timeout": 20}, ['"transaction_mode": "IMMEDIATE"']),
        ({"transaction_mode": "DEFERRED", "timeout": 20}, ['"transaction_mode": "IMMEDIATE"']),
        ({"transaction_mode": "IMMEDIATE"}, ['"timeout"']),
        ({"transaction_mode": "IMMEDIATE", "timeout": 20}, []),
    ],
)
def test_a_sqlite_database_without_the_two_options_fails_the_check_naming_them(
    options: dict[str, Any], missing: list[str]
) -> None:
    sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": "x.sqlite3", "OPTIONS": options}
    found = sqlite_problems({"default": sqlite})
    assert [message.id for message in found] == (["runs.E003"] if missing else [])
    for option in missing:
        assert option in found[0].msg
    assert sqlite_problems({"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "x"}}) == []


@pytest.mark.sqlite
@pytest.mark.timeout(10)
def test_the_urls_come_in_groups_a_project_can_include_apart_under_one_namespace() -> None:
    assert parts("api", "operations") == ([*operations, *api], "runs")
    assert parts("pages") == (pages, "runs")
    with pytest.raises(ValueError, match="some of operations, api, pages, not nope"):
        parts("api", "nope")
    # Under this site's prefix (none), the standalone site's paths.
    assert reverse("runs:run-list") == "/runs/"
    assert reverse("runs:run-stream", args=["r"]) == "/api/runs/r/stream/"
    assert reverse("runs:metrics") == "/metrics/"
    assert reverse("admin:runs_dashboard_changelist") == "/admin/runs/dashboard/"


@pytest.mark.sqlite
@pytest.mark.timeout(120)
def test_the_app_hardens_other_apps_admins_only_where_the_project_asks(tmp_path: Path) -> None:
    # This site asks (RUNLEDGER_HARDEN_ADMIN = True in config/settings.py).
    assert isinstance(admin.site._registry[User], HardenedAdmin)
    # A project that does not keeps its admins as they were; the app's own are hardened.
    show = (
        "import django, json; django.setup(); from django.contrib import admin; "
        "from django.contrib.auth.models import User; from runs.models import Run; "
        "from runs.admin.hardening import HardenedAdmin; "
        "print(json.dumps([isinstance(admin.site._registry[m], HardenedAdmin) for m in (User, Run)]))"
    )
    shown = in_a_bare_host(tmp_path, "-c", show)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout.splitlines()[-1]) == [False, True]
