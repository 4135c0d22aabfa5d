"""docs/how-to/embed.md followed as a person follows it, on SQLite and on PostgreSQL: a fresh
virtualenv, `django-admin startproject mysite`, the guide's Python blocks in the project's files,
its shell steps run in order (the built wheel for the package index's; createsuperuser answered on
a terminal; uvicorn and runworker with the guide's arguments), then Chromium signs in as the user
the guide created, starts a demo run, watches it to its end and opens the admin and the dashboard:
every stylesheet and script each page asks for loads (200) and no page's console shows an error."""

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest

from runs.conf import AppSettings
from tests.support import host as hosts
from tests.support import raw_http
from tests.support.browser import PageLoads, save_screenshot
from tests.support.host import Followed, Host, Venv
from tests.support.package import built_for_the_run
from tests.support.procs import Procs
from tests.support.signin import sign_in_over_http, signed_in_over_http

if TYPE_CHECKING:
    from playwright.sync_api import Page, Response

pytestmark = [pytest.mark.processes, pytest.mark.browser]


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """The reader's virtualenv: their project's Django (the release the app requires) and nothing
    of Runledger, which the guide's own `pip install` brings."""
    folder = tmp_path_factory.mktemp("venv")
    built = built_for_the_run(tmp_path_factory)
    venv = hosts.make_venv(folder / "venv", built.wheel)
    (django,) = [r for r in built.metadata().get_all("Requires-Dist", []) if r.startswith("Django")]
    venv.pip_install(django)
    return venv


@dataclass
class Guided:
    database: str
    host: Host
    followed: Followed


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def guided(request: pytest.FixtureRequest, venv: Venv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guided]:
    """A fresh `startproject mysite` on the database `param` with the guide's Python blocks in its
    files and its shell steps followed: migrated, its user created, uvicorn and a worker running."""
    folder = tmp_path_factory.mktemp(f"guided-{request.param}")
    with ExitStack() as stack:
        database = hosts.database_for(request, stack)
        host = hosts.start_project(venv, folder, package="mysite")
        hosts.write_the_guides_lines(host, database)
        hosts.wrap_the_application(host)
        procs = Procs(folder)
        # Stopped before the database is dropped (the stack unwinds last in, first out).
        stack.callback(procs.stop_all)
        yield Guided(request.param, host, hosts.follow_the_guide(procs, host))


def paths(urls: list[str]) -> set[str]:
    return {urlsplit(url).path for url in urls}


def ok(document: "Response | None") -> bool:
    """The page's own document (after any redirect) came with a 200."""
    return document is not None and document.status == 200


@pytest.mark.timeout(600)
def test_the_guides_steps_run_as_written_and_start_its_processes(guided: Guided) -> None:
    commands = hosts.guide_commands()
    assert [line.split()[:3] for line in commands] == [
        ["pip", "install", "'django-runledger[server,postgres]'"],
        ["python", "manage.py", "migrate"],
        ["python", "manage.py", "createsuperuser"],
        ["uvicorn", "mysite.asgi:application", "--no-proxy-headers"],
        ["python", "manage.py", "runworker"],
    ]
    assert [line for line, _ in guided.followed.said][1:] == commands[1:3]
    assert guided.followed.web.popen.args == ["uvicorn", "mysite.asgi:application", "--no-proxy-headers"]
    assert guided.followed.worker.popen.args == ["python", "manage.py", "runworker"]
    for proc in (guided.followed.web, guided.followed.worker):
        assert hosts.working_directory(proc) == guided.host.folder
    # The processes run the wheel's app, from the reader's virtualenv.
    where = guided.host.run("-c", "import runs; print(runs.__file__)").stdout.strip()
    assert Path(where).is_relative_to(guided.host.venv.root), where


@pytest.mark.timeout(600)
def test_a_person_signs_in_watches_a_demo_run_and_opens_the_admin_with_every_file_loaded(
    guided: Guided, browser_page: "Page"
) -> None:
    page, host = browser_page, guided.host
    base = guided.followed.web.url
    loads = PageLoads(page)

    # The admin's own login page, before signing in: styled.
    loads.begin()
    assert ok(page.goto(f"{base}/admin/"))
    assert page.url == f"{base}/admin/login/?next=/admin/"
    assert "/static/admin/css/base.css" in paths(loads.check())

    # The run list sends a signed-out reader to the login page the guide's URLs add.
    loads.begin()
    assert ok(page.goto(f"{base}{host.url('runs/')}"))
    assert page.url == f"{base}/accounts/login/?next={host.url('runs/')}"
    assert "/static/runs/site.css" in paths(loads.check())
    save_screenshot(page, f"embed-{guided.database}-login")

    loads.begin()
    page.fill("#id_username", hosts.ADMIN)
    page.fill("#id_password", hosts.PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}{host.url('runs/')}")
    loads.check()

    # A demo run from the list's form, watched to its end on its page.
    loads.begin()
    page.fill("#id_deltas", "8")
    page.fill("#id_delay_ms", "20")
    page.click("#demo-form button[type=submit]")
    page.wait_for_url(f"{base}{host.url('runs/')}*/")
    page.wait_for_function("document.getElementById('watch').dataset.status === 'completed'", timeout=30_000)
    assert {"/static/runs/runledger-client.js", "/static/runs/watch.js"} <= paths(loads.check())
    assert "chunk 7" in str(page.locator("#output").text_content())
    run_id = page.url.rstrip("/").rsplit("/", 1)[1]
    save_screenshot(page, f"embed-{guided.database}-watch")

    # The admin, signed in as the guide's user: its index, the run in the console, the dashboard.
    for path, shown in (
        ("/admin/", f"#user-tools:has-text('{hosts.ADMIN}')"),
        ("/admin/runs/run/", f"a[href='/admin/runs/run/{run_id}/change/']"),
        (f"/admin/runs/run/{run_id}/change/", "#content"),
        ("/admin/runs/dashboard/", "#rl-dashboard"),
    ):
        loads.begin()
        assert ok(page.goto(f"{base}{path}"))
        assert page.url == f"{base}{path}"
        page.locator(shown).first.wait_for()
        assert "/static/admin/css/base.css" in paths(loads.check())
    assert "/static/runs/dashboard.js" in paths(loads.check())
    save_screenshot(page, f"embed-{guided.database}-dashboard")


@pytest.mark.timeout(120)
def test_the_guides_login_page_refuses_guesses_past_the_limit_but_not_the_owner_elsewhere(guided: Guided) -> None:
    base, login = guided.followed.web.url, "/accounts/login/"
    # Guesses from an address of their own (any of 127.0.0.0/8 reaches the host).
    limit = AppSettings.AUTH_FAILURES_MAX.default_value()
    assert limit is not None  # sign-ins are limited by default
    for _ in range(limit):
        guess = sign_in_over_http(base, login, hosts.ADMIN, "a-guess", source="127.0.0.9")
        assert guess.status_code == 200 and "didn't match" in guess.text
    refused = sign_in_over_http(base, login, hosts.ADMIN, hosts.PASSWORD, source="127.0.0.9")
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) > 0
    # The owner signs in from her own address, 127.0.0.1, whose X-Forwarded-For a uvicorn with
    # proxy headers believes: this one names the guesser's, which would have refused her.
    forged = {"X-Forwarded-For": "127.0.0.9"}
    assert signed_in_over_http(
        sign_in_over_http(base, login, hosts.ADMIN, hosts.PASSWORD, source="127.0.0.1", headers=forged)
    )


@pytest.mark.timeout(120)
def test_the_static_files_served_are_the_installed_apps_and_nothing_beside_them(guided: Guided) -> None:
    web, venv = guided.followed.web, guided.host.venv
    address = ("127.0.0.1", int(web.port or 0))
    (installed,) = venv.root.glob("lib/python*/site-packages/runs/static/runs/site.css")
    served = raw_http.request(address, "/static/runs/site.css")
    assert served.status == 200 and served.body == installed.read_bytes()
    assert served.headers["content-type"].startswith("text/css")
    # The project's own files sit one folder up from nothing a finder serves.
    for path in ("/static/../mysite/settings.py", "/static/admin/../../mysite/settings.py", "/static/%2e%2e/manage.py"):
        answer = raw_http.request(address, path)
        assert answer.status in (400, 404), (path, answer.status)
        assert b"SECRET_KEY" not in answer.body and b"DJANGO_SETTINGS_MODULE" not in answer.body, path
