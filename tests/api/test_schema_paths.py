"""The app's OpenAPI schema names its operations where the project mounted the app — under two
hosts' prefixes and at the standalone site's root — the stream and the wait among them, each path
resolving to the view it documents; a site below a path of its own names it as the server; a
host's SPECTACULAR_SETTINGS and REST_FRAMEWORK change nothing of the schema, asked many times at
once. tests/client/test_generated_client.py generates a client from a live server's schema."""

import json
import re
import subprocess
import sys
import uuid
from typing import Any

import pytest
from django.test import Client
from django.test.utils import override_settings
from django.urls import resolve

from runs.streaming import views, wait
from tests.support.host_urls import PREFIX
from tests.support.procs import FAST_INTERVALS, ROOT, subprocess_env
from tests.support.urls import host_urlconf

pytestmark = pytest.mark.sqlite

# "": the standalone site, which includes the app at its root (config/urls.py).
PREFIXES = ["", "runledger/", "tools/agents/"]


def urlconf(prefix: str) -> Any:
    return host_urlconf(prefix) if prefix else "config.urls"


def app_schema(prefix: str, **extra: str) -> dict[str, Any]:
    response = Client().get(f"/{prefix}api/schema/", {"format": "json"}, **extra)
    assert response.status_code == 200, response.content
    schema: dict[str, Any] = json.loads(response.content)
    return schema


def operation_ids(schema: dict[str, Any], prefix: str) -> dict[tuple[str, str], str]:
    """Each operation's id (a generated client's name for it), by its path below the prefix."""
    return {
        (path.removeprefix(f"/{prefix}"), method): operation["operationId"]
        for path, operations in schema["paths"].items()
        for method, operation in operations.items()
    }


@pytest.mark.timeout(60)
@pytest.mark.parametrize("prefix", PREFIXES)
def test_every_path_in_the_schema_is_where_the_project_mounted_the_app(prefix: str) -> None:
    root = operation_ids(app_schema(""), "")
    with override_settings(ROOT_URLCONF=urlconf(prefix)):
        schema = app_schema(prefix)
        paths = schema["paths"]
        assert [path for path in paths if not path.startswith(f"/{prefix}api/")] == []
        for path in paths:
            match = resolve(re.sub(r"\{\w+\}", str(uuid.uuid4()), path))
            # The app's own route for it, not the API's catch-all 404 (which has no name).
            assert match.app_names == ["runs"] and match.url_name is not None, path
        stream, waits = f"/{prefix}api/runs/{{run_id}}/stream/", f"/{prefix}api/runs/{{run_id}}/wait/"
        assert resolve(stream.format(run_id=uuid.uuid4())).func is views.run_stream
        assert resolve(waits.format(run_id=uuid.uuid4())).func is wait.run_wait
    assert "servers" not in schema  # the paths are from the root of the host the schema came from
    assert f"`GET /{prefix}api/runs/{{run_id}}/events/`" in paths[stream]["get"]["description"]
    # The same operations under the same ids as at the root: a generated client's names do not
    # depend on where the app is.
    assert operation_ids(schema, prefix) == root
    assert len(root) == 33 and {("api/runs/{run_id}/stream/", "get"), ("api/runs/{run_id}/wait/", "get")} <= set(root)


@pytest.mark.timeout(60)
def test_a_site_below_a_path_of_its_own_names_that_path_as_the_schemas_server() -> None:
    # SCRIPT_NAME: what a proxy mounting the site at /site/ sends (uvicorn's --root-path,
    # FORCE_SCRIPT_NAME give Django the same), and the URLconf's paths leave out.
    with override_settings(ROOT_URLCONF=urlconf("runledger/")):
        below = app_schema("runledger/", SCRIPT_NAME="/site")
    assert below["servers"] == [{"url": "/site"}]
    assert "/runledger/api/runs/{run_id}/stream/" in below["paths"]


# A host's settings for its own APIs, each of which would change the app's schema if it reached it:
# paths trimmed, prefixed, camelized; another URLconf; only what an anonymous caller may use; no
# hooks (no stream, nor the app's endpoints only); a path of its own; no security schemes; servers.
HOSTS_SPECTACULAR: dict[str, Any] = {
    "TITLE": "The host's own API",
    "SERVE_URLCONF": "config.urls",
    "SERVE_PUBLIC": False,
    "SCHEMA_PATH_PREFIX": "/tools",
    "SCHEMA_PATH_PREFIX_TRIM": True,
    "SCHEMA_PATH_PREFIX_INSERT": "/v2",
    "CAMELIZE_NAMES": True,
    "PREPROCESSING_HOOKS": [],
    "POSTPROCESSING_HOOKS": [],
    "APPEND_PATHS": {"/hosts/own/": {"get": {"operationId": "hosts_own", "responses": {"200": {"description": "ok"}}}}},
    "AUTHENTICATION_WHITELIST": [],
    "COMPONENT_SPLIT_REQUEST": False,
    "ENUM_NAME_OVERRIDES": {},
    "SERVERS": [{"url": "https://api.example.com/v2"}],
}
HOSTS_REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_THROTTLE_CLASSES": ["rest_framework.throttling.AnonRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"anon": "1/day"},
    "DEFAULT_VERSIONING_CLASS": "rest_framework.versioning.QueryParameterVersioning",
}
THREADS, ROUNDS = 4, 3


@pytest.mark.timeout(180)
def test_a_hosts_own_schema_settings_change_nothing_of_the_apps_schema_asked_many_times_at_once() -> None:
    with override_settings(ROOT_URLCONF=urlconf(PREFIX)):
        expected = app_schema(PREFIX)
    code = {"ROOT_URLCONF": "tests.support.host_urls", "SPECTACULAR_SETTINGS": HOSTS_SPECTACULAR}
    code["REST_FRAMEWORK"] = HOSTS_REST_FRAMEWORK
    env = subprocess_env(DJANGO_SETTINGS_MODULE="tests.support.code_settings", CODE_SETTINGS=json.dumps(code))
    # This process's own RUNLEDGER_* settings, which the stream's description quotes.
    env = {name: value for name, value in env.items() if name not in FAST_INTERVALS}
    args = [sys.executable, "-m", "tests.support.schema_host", str(THREADS), str(ROUNDS)]
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.splitlines()[-1])
    assert said["statuses"] == [200] * THREADS * ROUNDS  # never the host's throttle
    assert said["app"] == [expected]  # one schema for every request: the app's own
    # The host's own schema, asked after all that, is made on the host's settings, which are back.
    hosts = said["hosts"]
    assert hosts["status"] == 200
    assert hosts["schema"]["info"]["title"] == HOSTS_SPECTACULAR["TITLE"]
    assert hosts["schema"]["servers"] == HOSTS_SPECTACULAR["SERVERS"]
    assert "/hosts/own/" in hosts["schema"]["paths"]
    plain = {name for name, value in HOSTS_SPECTACULAR.items() if not name.endswith("_HOOKS")}
    assert {name: said["after"][name] for name in plain} == {name: HOSTS_SPECTACULAR[name] for name in plain}
    assert said["after"]["PREPROCESSING_HOOKS"] == said["after"]["POSTPROCESSING_HOOKS"] == []
