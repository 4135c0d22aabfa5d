"""Browser apps on other origins (docs/how-to/cross-origin.md): the settings that page gives a host,
applied as written, answer a listed origin's preflights for the API and the stream (the token,
JSON, Idempotency-Key and Last-Event-ID allowed), give an origin not listed no CORS header, and
never open the app's pages or the admin; with the cookie settings a session's write from the listed
origin still needs its CSRF token, and without them it is refused. The standalone site applies
exactly the page's blocks, and refuses origins no browser sends. The same in Chromium:
tests/api/test_cors_browser.py."""

import json
import subprocess
import sys
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.test import Client
from pytest_django import Settings

from runs.models import Run
from tests.factories import queued_run
from tests.support.api import assert_error
from tests.support.db import token_for
from tests.support.docs import block
from tests.support.procs import ROOT, subprocess_env

pytestmark = [pytest.mark.sqlite, pytest.mark.timeout(30)]

PAGE = "how-to/cross-origin.md"
TOKEN_BLOCK, COOKIE_BLOCK = "settings.py", "settings.py: the session cookie too"
APP = "https://app.example.com"  # the origin the page's blocks allow
STRANGER = "https://evil.example.net"
# What a client of the API and the stream sends besides what CORS always allows.
SENT_HEADERS = {"authorization", "content-type", "idempotency-key", "last-event-id", "x-csrftoken"}
# The settings a host's blocks set, and that the standalone site's environment sets.
CORS_NAMES = (
    "INSTALLED_APPS",
    "MIDDLEWARE",
    "CSRF_TRUSTED_ORIGINS",
    "CORS_ALLOWED_ORIGINS",
    "CORS_URLS_REGEX",
    "CORS_ALLOW_HEADERS",
    "CORS_EXPOSE_HEADERS",
    "CORS_ALLOW_CREDENTIALS",
)


def documented(base: dict[str, Any], *titles: str) -> dict[str, Any]:
    """The settings `base` becomes once the page's blocks `titles` run on it, as in a host's settings.py."""
    namespace = {name: list(value) for name, value in base.items()}
    for title in titles:
        exec(block(PAGE, "python", title), namespace)
    return {name: value for name, value in namespace.items() if name.isupper()}


def apply_documented(settings: Settings, *titles: str) -> None:
    base = {name: getattr(django_settings, name) for name in ("INSTALLED_APPS", "MIDDLEWARE", "CSRF_TRUSTED_ORIGINS")}
    for name, value in documented(base, *titles).items():
        # The corsheaders app adds only its system checks; installing it here would reload the app
        # registry for one test. What answers requests is the middleware and its settings.
        if name != "INSTALLED_APPS":
            setattr(settings, name, value)


@pytest.fixture
def token_flavour(settings: Settings) -> None:
    apply_documented(settings, TOKEN_BLOCK)


@pytest.fixture
def cookie_flavour(settings: Settings) -> None:
    apply_documented(settings, TOKEN_BLOCK, COOKIE_BLOCK)


def cors_headers(response: Any) -> dict[str, str]:
    return {name.lower(): value for name, value in response.items() if name.lower().startswith("access-control-")}


def listed(header: str) -> set[str]:
    return {item.strip().lower() for item in header.split(",")}


def preflight(client: Client, path: str, origin: str, method: str, headers: str) -> Any:
    return client.options(
        path,
        HTTP_ORIGIN=origin,
        HTTP_ACCESS_CONTROL_REQUEST_METHOD=method,
        HTTP_ACCESS_CONTROL_REQUEST_HEADERS=headers,
    )


# --- the preflights ---------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("where", "method", "headers"),
    [
        ("/api/runs/", "POST", "authorization, content-type, idempotency-key"),
        ("/api/runs/{id}/stream/", "GET", "authorization, last-event-id"),
        ("/api/runs/{id}/wait/", "GET", "authorization"),
        ("/api/runs/{id}/cancel/", "POST", "authorization, content-type, x-csrftoken"),
    ],
)
def test_a_listed_origins_preflight_for_the_api_and_the_stream_allows_what_a_client_sends(
    token_flavour: None, alice: User, where: str, method: str, headers: str
) -> None:
    run = queued_run(alice)
    path = where.format(id=run.pk)
    answer = preflight(Client(), path, APP, method, headers)
    # Answered before any view: no credential is needed, nothing is read or written.
    assert (answer.status_code, answer.content) == (200, b"")
    found = cors_headers(answer)
    assert found["access-control-allow-origin"] == APP
    assert listed(found["access-control-allow-headers"]) >= SENT_HEADERS
    assert method.lower() in listed(found["access-control-allow-methods"])
    # The token flavour sends no cookie: the browser may not send one either.
    assert "access-control-allow-credentials" not in found
    assert "origin" in listed(answer["Vary"])
    assert Run.objects.count() == 1


# Committed rows: the stream reads its run on a thread of its own, which on SQLite would wait out the
# busy timeout behind the test's open transaction.
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("where", ["/api/runs/", "/api/runs/{id}/stream/", "/api/runs/{id}/cancel/"])
def test_an_origin_not_listed_gets_no_access_control_header_so_the_browser_refuses(
    token_flavour: None, alice: User, where: str
) -> None:
    path = where.format(id=queued_run(alice).pk)
    assert cors_headers(preflight(Client(), path, STRANGER, "POST", "authorization, content-type")) == {}
    # Nor does its request, were it sent anyway (a simple one, unpreflighted): the page cannot read it.
    answer = Client().get(path, HTTP_ORIGIN=STRANGER, HTTP_AUTHORIZATION=f"Token {token_for(alice)}")
    assert cors_headers(answer) == {}


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/runs/", "/accounts/login/", "/admin/login/", "/healthz/", "/metrics/"])
def test_the_apps_pages_and_the_admin_stay_closed_to_a_listed_origin(token_flavour: None, path: str) -> None:
    assert cors_headers(preflight(Client(), path, APP, "POST", "content-type")) == {}
    assert cors_headers(Client().get(path, HTTP_ORIGIN=APP)) == {}


# --- the answers ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_listed_origin_reads_the_apis_answers_and_its_refusals_with_the_headers_a_client_needs(
    token_flavour: None, alice: User
) -> None:
    run = queued_run(alice)
    token = token_for(alice)
    read = Client().get(f"/api/runs/{run.pk}/", HTTP_ORIGIN=APP, HTTP_AUTHORIZATION=f"Token {token}")
    assert read.status_code == 200
    exposed = {"retry-after", "idempotent-replayed"}
    assert cors_headers(read)["access-control-allow-origin"] == APP
    assert listed(cors_headers(read)["access-control-expose-headers"]) == exposed
    # A refusal too, by the API and by the stream's own checks: the page reads why, not a TypeError.
    for path in (f"/api/runs/{run.pk}/", f"/api/runs/{run.pk}/stream/"):
        refused = Client().get(path, HTTP_ORIGIN=APP)
        assert_error(refused, 401, "not_authenticated")
        assert cors_headers(refused)["access-control-allow-origin"] == APP


# --- the session cookie -----------------------------------------------------------------------------


@pytest.fixture
def signed_in(alice: User) -> tuple[Client, str, Run]:
    """A client that enforces CSRF as a browser's requests meet it, signed in as alice; its CSRF
    token (the `csrftoken` cookie, set by the sign-in page as for a person); a queued run of hers."""
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    browser.get("/accounts/login/")
    return browser, browser.cookies["csrftoken"].value, queued_run(alice)


def cancel(browser: Client, run: Run, **headers: str) -> Any:
    return browser.post(f"/api/runs/{run.pk}/cancel/", {}, content_type="application/json", HTTP_ORIGIN=APP, **headers)


@pytest.mark.django_db
def test_with_the_cookie_settings_a_sessions_write_from_the_listed_origin_still_needs_its_csrf_token(
    cookie_flavour: None, signed_in: tuple[Client, str, Run]
) -> None:
    browser, csrf, run = signed_in
    assert "CSRF" in assert_error(cancel(browser, run), 403, "permission_denied")["error"]["message"]
    assert Run.objects.get(pk=run.pk).status == "queued"
    done = cancel(browser, run, HTTP_X_CSRFTOKEN=csrf)
    assert (done.status_code, done.json()["status"]) == (200, "cancelled"), done.content
    assert cors_headers(done)["access-control-allow-credentials"] == "true"
    assert cors_headers(done)["access-control-allow-origin"] == APP


@pytest.mark.django_db
def test_without_the_cookie_settings_a_sessions_write_from_another_origin_is_refused_token_or_not(
    token_flavour: None, signed_in: tuple[Client, str, Run]
) -> None:
    browser, csrf, run = signed_in
    refused = cancel(browser, run, HTTP_X_CSRFTOKEN=csrf)
    assert "Origin checking failed" in assert_error(refused, 403, "permission_denied")["error"]["message"]
    # And the browser would not have handed the answer to the page (nor sent the cookie).
    assert "access-control-allow-credentials" not in cors_headers(refused)
    assert Run.objects.get(pk=run.pk).status == "queued"


# --- the standalone site ----------------------------------------------------------------------------

SITE_SETTINGS = f"""
import json, django
django.setup()
from django.conf import settings
print(json.dumps({{name: getattr(settings, name, None) for name in {CORS_NAMES!r}}}))
"""


def site(**env: str) -> subprocess.CompletedProcess[str]:
    """The standalone site's settings loaded with `env`: its output is the CORS settings as JSON."""
    return subprocess.run(
        [sys.executable, "-c", SITE_SETTINGS],
        cwd=ROOT,
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def site_settings(**env: str) -> dict[str, Any]:
    loaded = site(**env)
    assert loaded.returncode == 0, loaded.stderr
    return dict(json.loads(loaded.stdout))


def as_loaded(found: dict[str, Any]) -> dict[str, Any]:
    """`found`'s CORS settings as the site's process prints them (JSON: a tuple is a list)."""
    return dict(json.loads(json.dumps({name: found.get(name) for name in CORS_NAMES})))


@pytest.mark.processes
@pytest.mark.timeout(120)
def test_the_standalone_site_applies_exactly_the_blocks_the_how_to_gives_a_host() -> None:
    plain = site_settings()
    assert plain["CORS_ALLOWED_ORIGINS"] is None and "corsheaders" not in plain["INSTALLED_APPS"]
    base = {name: plain[name] for name in ("INSTALLED_APPS", "MIDDLEWARE", "CSRF_TRUSTED_ORIGINS")}

    token = site_settings(DJANGO_CORS_ALLOWED_ORIGINS=APP)
    assert token == as_loaded(documented(base, TOKEN_BLOCK))
    assert token["CORS_ALLOW_CREDENTIALS"] is None  # django-cors-headers' default: False
    cookie = site_settings(DJANGO_CORS_ALLOWED_ORIGINS=APP, DJANGO_CORS_ALLOW_CREDENTIALS="1")
    assert cookie == as_loaded(documented(base, TOKEN_BLOCK, COOKIE_BLOCK))


@pytest.mark.processes
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DJANGO_CORS_ALLOWED_ORIGINS": "*"}, "DJANGO_CORS_ALLOWED_ORIGINS must list origins such as"),
        ({"DJANGO_CORS_ALLOWED_ORIGINS": f"{APP}/"}, f"not '{APP}/'"),
        ({"DJANGO_CORS_ALLOWED_ORIGINS": "app.example.com"}, "not 'app.example.com'"),
        ({"DJANGO_CORS_ALLOWED_ORIGINS": "http://[::1"}, "not 'http://[::1'"),
        ({"DJANGO_CORS_ALLOW_CREDENTIALS": "1"}, "DJANGO_CORS_ALLOW_CREDENTIALS=1 needs the origins"),
    ],
)
def test_the_standalone_site_refuses_origins_no_browser_sends_naming_the_variable(
    env: dict[str, str], message: str
) -> None:
    refused = site(**env)
    assert refused.returncode != 0
    assert "ImproperlyConfigured" in refused.stderr and message in refused.stderr, refused.stderr
