"""Real-browser fixtures: Playwright for Python driving Debian's Chromium.

Never a browser build downloaded by a tool: `chromium` is the Debian package (bin/test installs it).

    def test_something(browser_page: Page, procs: Procs) -> None:
        web = procs.uvicorn()
        give_password(staff, PASSWORD)
        admin_login(browser_page, web.url, "oncall", PASSWORD)
        save_screenshot(browser_page, "something")   # artifacts/something.png

A module of tests using these is marked BROWSER_TESTS (browser, processes, a transactional
database), so that what the test writes is committed for the server process to see.
"""

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.db import connections

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser
    from playwright.sync_api import Browser, ConsoleMessage, Page, Response

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"

BROWSER_TESTS = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

CHROMIUM_ARGS = [
    "--no-sandbox",  # the tests run as root
    "--disable-gpu",
    # Without these Chromium keeps calling outside hosts, which this closed network refuses.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

# Bounds every Playwright wait (expect, click, goto) unless a call gives its own.
DEFAULT_TIMEOUT_MS = 15_000


@pytest.fixture
def chromium(monkeypatch: pytest.MonkeyPatch) -> Iterator["Browser"]:
    """A headless Debian Chromium for one test.

    Playwright's sync API runs its asyncio loop in a greenlet of this thread, so Django sees a
    "running event loop" and would refuse ORM calls made by the test itself. They are plain
    synchronous calls, safe here, so the guard is lifted — for this test only: a session-wide
    browser would lift it (and leave the loop) under every later test, so each test gets its own.
    """
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("Debian's chromium is not installed: apt-get install -y chromium (bin/test does this)")
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
            # While that loop runs, asgiref's Local hands the test's ORM calls a database
            # connection of their own (so browser tests must use transaction=True). Close it here,
            # where it is still the one visible, or it outlives the test.
            connections.close_all()


@pytest.fixture
def browser_page(chromium: "Browser") -> Iterator["Page"]:
    context = chromium.new_context(viewport={"width": 1440, "height": 1000})
    context.set_default_timeout(DEFAULT_TIMEOUT_MS)
    page = context.new_page()
    try:
        yield page
    finally:
        context.close()


def give_password(user: "AbstractBaseUser", password: str) -> None:
    """Set a password that a server process can check.

    The test process hashes with MD5 for speed (tests.conftest), a hasher the server's settings do
    not list; this stores a PBKDF2 hash, the server's default, with few iterations to stay fast.
    """
    user.password = PBKDF2PasswordHasher().encode(password, PBKDF2PasswordHasher().salt(), iterations=1000)
    user.save(update_fields=["password"])


def site_login(page: "Page", base_url: str, username: str, password: str) -> None:
    """Log in through the site's login page; it lands on the user's run list."""
    page.goto(f"{base_url}/accounts/login/?next=/runs/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base_url}/runs/")


def admin_login(page: "Page", base_url: str, username: str, password: str) -> None:
    """Log in through the admin's own login page, as a person would."""
    from playwright.sync_api import expect

    page.goto(f"{base_url}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    expect(page.locator("#user-tools")).to_contain_text(username)


def save_screenshot(page: "Page", name: str) -> Path:
    """A full-page PNG under artifacts/ (gitignored), kept as the test's artefact."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


class PageLoads:
    """What each page a test opens asks for and says: the status of every stylesheet and script
    it requested, and every error on its console or thrown by its scripts.

        loads = PageLoads(page)
        loads.begin(); page.goto(url)     # or a click that navigates
        loads.check()                     # the page's files all 200, its console without error

    Routing every request through Playwright turns the browser's HTTP cache off (Playwright's
    rule), so each page fetches its files afresh: a file answered 304, or taken from the cache
    unasked, would prove nothing of the server."""

    # The browser asks for /favicon.ico by itself, of any page without an icon: the host project's
    # (a new project has none), not a file any page of the app or the admin asks for.
    BROWSERS_OWN = "/favicon.ico"

    def __init__(self, page: "Page") -> None:
        self.page = page
        self.files: dict[str, int] = {}
        self.errors: list[str] = []
        page.route("**/*", lambda route: route.continue_())
        page.on("response", self._response)
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.errors.append(f"uncaught: {error}"))

    def _response(self, response: "Response") -> None:
        if response.request.resource_type in ("stylesheet", "script"):
            self.files[response.url] = response.status

    def _console(self, message: "ConsoleMessage") -> None:
        where = message.location.get("url", "")
        if message.type == "error" and urlsplit(where).path != self.BROWSERS_OWN:
            self.errors.append(f"{message.text} ({where})")

    def begin(self) -> None:
        self.files.clear()
        self.errors.clear()

    def check(self) -> list[str]:
        """Once the page has loaded: every stylesheet and script its document links was answered
        200, as was every other one it requested, and nothing went to its console as an error.
        The files it links, for the test to check it has the ones it expects."""
        self.page.wait_for_load_state("load")
        # Its linked files' statuses as the page's own resource timing has them, complete once it
        # has loaded (the response events may come later than the load).
        linked: dict[str, int | None] = dict(
            self.page.eval_on_selector_all("link[rel~=stylesheet][href], script[src]", self._STATUSES)
        )
        assert linked == dict.fromkeys(linked, 200), (self.page.url, linked)
        assert set(self.files.values()) <= {200}, (self.page.url, self.files)
        assert self.errors == [], (self.page.url, self.errors)
        return list(linked)

    _STATUSES = """found => found.map(e => {
        const url = e.href || e.src;
        const timing = performance.getEntriesByName(url, "resource")[0];
        return [url, timing ? timing.responseStatus : null];
    })"""
