"""An app on another origin in Chromium (docs/how-to/cross-origin.md): a plain page served by a
second HTTP server (tests/support/other_origin.py) calls the standalone site with `fetch`, through a
proxy that records every request and can cut the stream.

With the origin listed (DJANGO_CORS_ALLOWED_ORIGINS) and a token, the page creates a run, reads its
stream across a cut (resumed with Last-Event-ID, the events exactly the stored log) and cancels it.
With no CORS settings, or from an origin not listed (localhost and 127.0.0.1 are two), the browser
refuses each: the page gets a TypeError, and a create or a cancel refused at its preflight never
reaches the server. The session cookie with its CSRF token works only where
DJANGO_CORS_ALLOW_CREDENTIALS=1 allows it.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page

from runs.models import Run
from tests.factories import queued_run
from tests.support.browser import BROWSER_TESTS, give_password, site_login
from tests.support.db import token_for
from tests.support.live import assert_is_the_stored_log
from tests.support.other_origin import OtherOrigin
from tests.support.procs import Proc, Procs, subprocess_env
from tests.support.proxies import CuttableProxy

pytestmark = [*BROWSER_TESTS, pytest.mark.timeout(120)]

PASSWORD = "cross-origin-pw"
LISTED = "127.0.0.1"  # the app's host in the origin the sites list; "localhost" is another origin
DEMO = {"agent": "demo", "input": {"deltas": 400, "delay_ms": 20}}
WAIT_MS = 20_000


@dataclass
class Sites:
    tokens: Proc  # the app's origin listed
    cookies: Proc  # listed, and the session cookie allowed too
    closed: Proc  # no CORS settings: the default
    app: OtherOrigin


@pytest.fixture(scope="module")
def sites(django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sites]:
    registry = Procs(Path(tmp_path_factory.mktemp("cors")))
    with OtherOrigin() as app:
        try:
            with django_db_blocker.unblock():
                env = subprocess_env()
            listed = {"DJANGO_CORS_ALLOWED_ORIGINS": app.origin(LISTED)}
            tokens = registry.uvicorn(env={**env, **listed})
            cookies = registry.uvicorn(env={**env, **listed, "DJANGO_CORS_ALLOW_CREDENTIALS": "1"})
            closed = registry.uvicorn(env=env)
            registry.worker("cors", concurrency=2, env=env)
            yield Sites(tokens=tokens, cookies=cookies, closed=closed, app=app)
        finally:
            registry.stop_all()


@pytest.fixture
def through() -> Iterator[Callable[[Proc], CuttableProxy]]:
    """A proxy in front of a site, recording every request the browser sends it."""
    started: list[CuttableProxy] = []

    def proxy(web: Proc) -> CuttableProxy:
        started.append(CuttableProxy(upstream_port=int(web.port or 0)).start())
        return started[-1]

    yield proxy
    for proxy_started in started:
        proxy_started.stop()


def call(page: Page, base: str, path: str, auth: dict[str, Any], method: str = "GET", body: Any = None) -> Any:
    """The page's fetch: {status, body}, or {error, message} when the browser refused it."""
    options = {"method": method} | ({} if body is None else {"body": body})
    return page.evaluate("([b, p, a, o]) => window.call(b, p, a, o)", [base, path, auth, options])


def follow(page: Page, base: str, run_id: str, auth: dict[str, Any]) -> None:
    """Start the page's stream reader, which goes on by itself (window.streamed)."""
    page.evaluate("([b, id, a]) => { window.follow(b, id, a); }", [base, run_id, auth])


def wait_events(page: Page, at_least: int) -> int:
    page.wait_for_function("n => window.streamed.events.length >= n", arg=at_least, timeout=WAIT_MS)
    return int(page.evaluate("() => window.streamed.events.length"))


def methods_to(proxy: CuttableProxy, path: str) -> list[str]:
    return [seen.method for seen in list(proxy.requests) if seen.path == path]


def create_stream_cut_and_cancel(page: Page, proxy: CuttableProxy, owner: User, auth: dict[str, Any]) -> None:
    """What an app does, all of which must work: create a run, read its stream, lose the connection
    once and resume, cancel the run, and read the stream to its end — exactly the stored log."""
    created = call(page, proxy.url, "/api/runs/", auth, "POST", DEMO)
    assert created.get("status") == 201, created
    run_id = created["body"]["id"]
    follow(page, proxy.url, run_id, auth)
    at_cut = wait_events(page, 10)
    assert proxy.cut_streams() >= 1
    wait_events(page, at_cut + 10)
    cancelled = call(page, proxy.url, f"/api/runs/{run_id}/cancel/", auth, "POST", {})
    assert cancelled.get("status") == 200, cancelled
    assert cancelled["body"]["status"] == "cancelled"
    page.wait_for_function("() => window.streamed.done", timeout=WAIT_MS)
    streamed = page.evaluate("() => window.streamed")
    assert streamed["error"] is None
    assert streamed["events"][-1]["type"] == "run.cancelled"
    assert_is_the_stored_log(streamed["events"], run_id)
    assert Run.objects.get(pk=run_id).owner == owner
    # Each reconnect sent the last event id the page had whole; the last met the end (204).
    gets = [seen for seen in proxy.stream_requests() if seen.method == "GET"]
    assert len(gets) == streamed["connects"] >= 3
    assert "last-event-id" not in gets[0].headers
    assert all(seen.headers["last-event-id"].isdigit() for seen in gets[1:])
    assert streamed["status"] == 204


def assert_refused(page: Page, proxy: CuttableProxy, owner: User, auth: dict[str, Any]) -> None:
    """Each of create, stream and cancel fails in the page with a TypeError; a create or a cancel
    refused at its preflight never reached the server."""
    created = call(page, proxy.url, "/api/runs/", auth, "POST", DEMO)
    assert created.get("error") == "TypeError", created
    assert methods_to(proxy, "/api/runs/") == ["OPTIONS"]
    assert not Run.objects.filter(owner=owner).exists()

    run = queued_run(owner)
    follow(page, proxy.url, str(run.pk), auth)
    page.wait_for_function("() => window.streamed.error !== null", timeout=WAIT_MS)
    streamed = page.evaluate("() => window.streamed")
    assert (streamed["error"], streamed["connects"], streamed["events"]) == ("TypeError", 0, [])

    cancel_path = f"/api/runs/{run.pk}/cancel/"
    cancelled = call(page, proxy.url, cancel_path, auth, "POST", {})
    assert cancelled.get("error") == "TypeError", cancelled
    assert methods_to(proxy, cancel_path) == ["OPTIONS"]
    assert Run.objects.get(pk=run.pk).status != "cancelled"  # a worker may have run it meanwhile


# --- a token --------------------------------------------------------------------------------------


def test_an_app_on_a_listed_origin_creates_streams_across_a_cut_and_cancels_with_a_token(
    sites: Sites, through: Callable[[Proc], CuttableProxy], browser_page: Page, alice: User
) -> None:
    proxy = through(sites.tokens)
    browser_page.goto(sites.app.url(LISTED))
    auth = {"token": token_for(alice)}
    create_stream_cut_and_cancel(browser_page, proxy, alice, auth)
    # Each kind of request was preflighted, and allowed: the token, JSON, and the stream's cursor.
    preflights = [seen for seen in list(proxy.requests) if seen.method == "OPTIONS"]
    asked = {seen.headers.get("access-control-request-headers", "") for seen in preflights}
    assert "authorization,content-type" in asked and "authorization" in asked
    # A refusal by Runledger itself reaches the app, with its reason.
    refused = call(browser_page, proxy.url, "/api/runs/", {})
    assert (refused["status"], refused["body"]["error"]["code"]) == (401, "not_authenticated")


@pytest.mark.parametrize(("site", "host"), [("closed", LISTED), ("tokens", "localhost")])
def test_without_the_settings_or_from_an_origin_not_listed_the_browser_refuses_each_call(
    sites: Sites, through: Callable[[Proc], CuttableProxy], browser_page: Page, alice: User, site: str, host: str
) -> None:
    proxy = through(getattr(sites, site))
    browser_page.goto(sites.app.url(host))
    assert_refused(browser_page, proxy, alice, {"token": token_for(alice)})


# --- the session cookie ---------------------------------------------------------------------------


def signed_in_app(page: Page, sites: Sites, web: Proc, user: User) -> None:
    """`user` signs in on Runledger's own sign-in page (of `web`: the session is good on every site,
    one database and one key), then opens the app on the listed origin: its host is Runledger's, so
    the session cookie is same-site and the csrftoken cookie readable."""
    give_password(user, PASSWORD)
    site_login(page, web.url, user.username, PASSWORD)
    page.goto(sites.app.url(LISTED))


def test_with_the_cookie_settings_a_signed_in_user_creates_streams_and_cancels_with_the_csrf_token(
    sites: Sites, through: Callable[[Proc], CuttableProxy], browser_page: Page, alice: User
) -> None:
    signed_in_app(browser_page, sites, sites.cookies, alice)
    proxy = through(sites.cookies)
    # Without its CSRF token a write is refused, and the app reads why.
    refused = call(browser_page, proxy.url, "/api/runs/", {"cookies": True, "csrf": False}, "POST", DEMO)
    assert (refused.get("status"), refused["body"]["error"]["code"]) == (403, "permission_denied"), refused
    assert "CSRF" in refused["body"]["error"]["message"]
    assert not Run.objects.filter(owner=alice).exists()
    create_stream_cut_and_cancel(browser_page, proxy, alice, {"cookies": True})


def test_without_the_cookie_settings_the_browser_refuses_the_session_cookie_from_a_listed_origin(
    sites: Sites, through: Callable[[Proc], CuttableProxy], browser_page: Page, alice: User
) -> None:
    # The session is good here too: only CORS stands in the way.
    signed_in_app(browser_page, sites, sites.tokens, alice)
    assert_refused(browser_page, through(sites.tokens), alice, {"cookies": True})
