"""Real-browser fixtures: Playwright for Python driving Debian's Chromium.

Never a browser build downloaded by a tool (`playwright install` cannot reach anything here):
`chromium` is the Debian package, which bin/test installs when it is missing.

    def test_something(browser_page: Page, procs: Procs) -> None:
        web = procs.uvicorn()
        give_password(staff, PASSWORD)
        admin_login(browser_page, web.url, "oncall", PASSWORD)
        ...
        save_screenshot(browser_page, "something")   # artifacts/something.png

Tests using these need `@pytest.mark.browser`, and a server process: `processes` and
`django_db(transaction=True)`, so that what the test writes is committed for uvicorn to see.
"""

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.db import connections

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser
    from playwright.sync_api import Browser, Page

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"

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
