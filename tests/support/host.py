"""A host project of its own, as a Django team that already has a site would add the app to it: a
fresh virtualenv with the built wheel (never the checkout), `django-admin startproject config
host`, the few lines docs/how-to/embed.md says a host adds (read from the page), and its
processes — the host's stock uvicorn and `manage.py runworker` — started from the host's folder.
tests/test_host.py drives them over HTTP."""

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psycopg

from tests.support.docs import block
from tests.support.package import checkout_files
from tests.support.procs import FAST_INTERVALS, ROOT, Proc, Procs, free_port, wait_http_ok, wait_log_line
from tests.support.sse import Event, Stream, auth_headers

# The superuser every host gets, for the admin and for its API token.
ADMIN, PASSWORD = "admin", "host-admin-password"
METRICS_TOKEN = "a-host-chosen-metrics-bearer"
NO_ISSUES = "System check identified no issues (0 silenced)."


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without the checkout's: its settings module and database, pytest's
    variables, every RUNLEDGER_* and DJANGO_* (the standalone site reads both) and PYTHONPATH. A
    host's processes then know only what their own settings say."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "RUNLEDGER_", "DJANGO_")) and k not in ("DATABASE_URL", "PYTHONPATH")
    }
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@dataclass
class Venv:
    root: Path
    wheel: Path

    def bin(self, name: str) -> Path:
        return self.root / "bin" / name

    def install(self, extras: str) -> None:
        """The wheel with `extras`, from PyPI's packages for everything else."""
        done = subprocess.run(
            [self.bin("pip"), "install", "--disable-pip-version-check", "-q", f"{self.wheel}[{extras}]"],
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=540,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def make_venv(folder: Path, wheel: Path) -> Venv:
    """`python3 -m venv`, not the checkout's .venv: nothing of the project is installed in it."""
    subprocess.run(["python3", "-m", "venv", str(folder)], check=True, capture_output=True, timeout=120)
    return Venv(folder, wheel)


@dataclass
class Host:
    """A project folder (manage.py and config/) served by `venv`'s Python, on its own settings."""

    folder: Path
    venv: Venv
    # Where the app's URLs are: "runledger/" in a host, "" in the standalone site.
    prefix: str = "runledger/"
    # Its processes' environment: none of the checkout's (the standalone site's comes from here).
    env: dict[str, str] = field(default_factory=clean_env)

    @property
    def settings(self) -> Path:
        return self.folder / "config" / "settings.py"

    def run(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """`python ARGS` in the host's folder (its cwd, so its first sys.path entry is the host)."""
        return subprocess.run(
            [str(self.venv.bin("python")), *args],
            cwd=self.folder,
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def manage(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return self.run("manage.py", *args, env=env)

    def must(self, *args: str, env: dict[str, str] | None = None) -> str:
        """`manage.py ARGS`, which must succeed: its standard output."""
        done = self.manage(*args, env=env)
        assert done.returncode == 0, f"manage.py {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def append_settings(self, values: dict[str, Any]) -> None:
        # repr: each value as Python source, of its own type (0.5, not "0.5").
        lines = [f"{name} = {value!r}" for name, value in values.items()]
        with self.settings.open("a") as settings:
            settings.write("\n" + "\n".join(lines) + "\n")

    def url(self, path: str) -> str:
        """The path of one of the app's URLs under the host's prefix."""
        return f"/{self.prefix}{path}"

    def create_admin_token(self) -> str:
        superuser = ["createsuperuser", "--noinput", "--username", ADMIN, "--email", "a@example.com"]
        self.must(*superuser, env=self.env | {"DJANGO_SUPERUSER_PASSWORD": PASSWORD})
        # The key alone on standard output, as its last line (the note goes to standard error).
        said = self.must("create_token", ADMIN)
        return said.splitlines()[-1]


def _replace_once(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path} no longer holds {old!r} once: startproject's template changed"
    path.write_text(text.replace(old, new))


def start_project(venv: Venv, parent: Path) -> Host:
    """`django-admin startproject config host`: a host whose settings package is `config`, like the
    standalone site's, which the wheel therefore must not ship."""
    folder = parent / "host"
    folder.mkdir()
    done = subprocess.run(
        [str(venv.bin("django-admin")), "startproject", "config", str(folder)],
        cwd=parent,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return Host(folder=folder, venv=venv)


# The guide whose settings, URLs and ASGI lines a host adds: the tests take them from the page.
GUIDE = "how-to/embed.md"


def add_the_app(host: Host, database: dict[str, Any] | None = None, **settings: Any) -> None:
    """What docs/how-to/embed.md says a host adds, read from the page, in its own generated files:
    the apps, the SQLite options (or, given `database`, its PostgreSQL database), the include() —
    plus the settings it chooses (the metrics bearer, short intervals for tests, and `settings`).
    asgi.py stays as startproject wrote it."""
    with host.settings.open("a") as file:
        file.write("\n" + block(GUIDE, "python", "settings.py"))
        if database is None:
            file.write(block(GUIDE, "python", "settings.py, on SQLite"))
        else:
            file.write(f'DATABASES["default"] = {database!r}\n')
    # FAST_INTERVALS are environment strings; a host writes numbers.
    chosen = {"RUNLEDGER_METRICS_TOKEN": METRICS_TOKEN}
    host.append_settings(chosen | {name: json.loads(value) for name, value in FAST_INTERVALS.items()} | settings)
    urls = block(GUIDE, "python", "urls.py")
    assert f'path("{host.prefix}", include("runs.urls"))' in urls, urls
    with (host.folder / "config" / "urls.py").open("a") as file:
        file.write("\n" + urls)


def take_the_environment(host: Host) -> None:
    """The one line docs/design/deployment.md#settings says a settings module adds, last, to take
    the `RUNLEDGER_*` environment variables."""
    with host.settings.open("a") as file:
        file.write("\n" + block("design/deployment.md", "python", "settings.py"))


def wrap_the_application(host: Host) -> None:
    """The guide's optional ASGI wrapper, in place of startproject's last line of asgi.py."""
    _replace_once(
        host.folder / "config" / "asgi.py", "application = get_asgi_application()\n", block(GUIDE, "python", "asgi.py")
    )


def copy_site(venv: Venv, folder: Path) -> Host:
    """The standalone site as a folder of its own: config/, manage.py and templates/ as git holds
    them, without runs/ (the venv's wheel provides it), on a SQLite file there. It reads its
    settings from the environment: the short intervals too."""
    for path in checkout_files():
        if path == "manage.py" or path.startswith(("config/", "templates/")):
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / path, folder / path)
    env = clean_env(DATABASE_URL=f"sqlite:///{folder / 'site.sqlite3'}", **FAST_INTERVALS)
    return Host(folder=folder, venv=venv, prefix="", env=env)


@contextlib.contextmanager
def own_database(test_database_url: str) -> Iterator[dict[str, Any]]:
    """A database of the host's own on the server of the tests' database (the host migrates its
    own schema, which must not meet pytest-django's): its Django settings, dropped afterwards."""
    name = f"host_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(test_database_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        parts = urlsplit(test_database_url)
        yield {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": parts.username or "",
            "PASSWORD": parts.password or "",
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
        }
    finally:
        with psycopg.connect(test_database_url, autocommit=True) as admin:
            # FORCE: a connection a killed process left behind must not keep the database.
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def start_web(procs: Procs, host: Host) -> Proc:
    """The host's stock `uvicorn config.asgi:application`, found from its folder (uvicorn's default
    --app-dir is the working directory)."""
    port = free_port()
    args = [str(host.venv.bin("uvicorn")), "config.asgi:application", "--host", "127.0.0.1", "--port", str(port)]
    args += ["--no-access-log", "--log-level", "warning"]
    # From the host's folder: from the checkout, its runs/ and config/ would shadow the wheel's and the host's.
    proc = procs.start("host-uvicorn", args, host.env, port=port, cwd=host.folder)
    wait_http_ok(proc, host.url("healthz/"), timeout=60)
    return proc


def start_worker(procs: Procs, host: Host) -> Proc:
    args = [str(host.venv.bin("python")), "manage.py", "runworker", "--worker-id", "host", "--concurrency", "4"]
    proc = procs.start("host-worker", args, host.env, cwd=host.folder)
    wait_log_line(proc, "runworker host ready", timeout=60)
    return proc


def working_directory(proc: Proc) -> Path:
    return Path(os.readlink(f"/proc/{proc.pid}/cwd"))


# --- talking to a served host --------------------------------------------------------------------


def api(web: Proc, token: str) -> httpx.Client:
    return httpx.Client(base_url=web.url, headers={"Authorization": f"Token {token}"}, timeout=20)


def create_demo_run(client: httpx.Client, host: Host, **demo_input: Any) -> str:
    created = client.post(host.url("api/runs/"), json={"agent": "demo", "input": demo_input})
    assert created.status_code == 201, created.text
    run_id: str = created.json()["id"]
    return run_id


def stream_to_end(web: Proc, host: Host, run_id: str, token: str, timeout: float = 60) -> tuple[Stream, list[Event]]:
    """One SSE connection to the run's stream, read until the server ends it (after the terminal
    event): the answer's head and every event dispatched."""

    async def read() -> tuple[Stream, list[Event]]:
        stream = await Stream(web.url, host.url(f"api/runs/{run_id}/stream/"), auth_headers(token)).open()
        try:
            return stream, [event async for event in stream.events()]
        finally:
            stream.close()

    async def bounded() -> tuple[Stream, list[Event]]:
        return await asyncio.wait_for(read(), timeout)

    return asyncio.run(bounded())


def signed_in_admin(web: Proc) -> httpx.Client:
    """A browser-like client signed in through the admin's own login form as the superuser."""
    client = httpx.Client(base_url=web.url, timeout=20)
    form = client.get("/admin/login/")
    assert form.status_code == 200, form.text
    fields = {
        "username": ADMIN,
        "password": PASSWORD,
        "csrfmiddlewaretoken": client.cookies["csrftoken"],
        "next": "/admin/",
    }
    signed_in = client.post("/admin/login/?next=/admin/", data=fields)
    assert signed_in.status_code == 302 and signed_in.headers["location"] == "/admin/", signed_in.text
    return client


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs += [value for name, value in attrs if name == "href" and value]


def links(html: str) -> list[str]:
    parser = _Links()
    parser.feed(html)
    return parser.hrefs
