"""A host project of its own, as a Django team that already has a site would add the app to it: a
fresh virtualenv with the built wheel (never the checkout), `django-admin startproject config
host`, the few lines docs/how-to/embed.md says a host adds (read from the page), and its
processes — the host's stock uvicorn and `manage.py runworker` — started from the host's folder.
tests/deploy/test_host.py drives them over HTTP."""

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import socket
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
import pytest

from tests.support.docs import block, code_blocks
from tests.support.package import checkout_files
from tests.support.procs import (
    FAST_INTERVALS,
    ROOT,
    Proc,
    Procs,
    database_url,
    free_port,
    wait_http_ok,
    wait_log_line,
)
from tests.support.sse import Event, Stream, auth_headers
from tests.support.terminal import answer_prompts

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
        self.pip_install(f"{self.wheel}[{extras}]")

    def pip_install(self, *requirements: str) -> None:
        done = subprocess.run(
            [self.bin("pip"), "install", "--disable-pip-version-check", "-q", *requirements],
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
    # Its settings package, which startproject names: the guide's `mysite` or the standalone site's `config`.
    package: str = "config"
    # Its processes' environment: none of the checkout's (the standalone site's comes from here).
    env: dict[str, str] = field(default_factory=clean_env)

    def file(self, name: str) -> Path:
        """One of the settings package's files: settings.py, urls.py, asgi.py."""
        return self.folder / self.package / name

    @property
    def settings(self) -> Path:
        return self.file("settings.py")

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


def start_project(venv: Venv, parent: Path, package: str = "config") -> Host:
    """`django-admin startproject config host`: by default a host whose settings package is
    `config`, like the standalone site's, which the wheel therefore must not ship."""
    folder = parent / "host"
    folder.mkdir()
    done = subprocess.run(
        [str(venv.bin("django-admin")), "startproject", package, str(folder)],
        cwd=parent,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return Host(folder=folder, venv=venv, package=package)


# The guide whose settings, URLs and ASGI lines a host adds: the tests take them from the page.
GUIDE = "how-to/embed.md"


def write_the_guides_lines(host: Host, database: dict[str, Any] | None = None) -> None:
    """What docs/how-to/embed.md says a host adds to its settings and URLs, read from the page, in
    its own generated files: the apps, the SQLite options (or, given `database`, its usual
    PostgreSQL entry), the include()s."""
    with host.settings.open("a") as file:
        file.write("\n" + block(GUIDE, "python", "settings.py"))
        if database is None:
            file.write(block(GUIDE, "python", "settings.py, on SQLite"))
        else:
            file.write(f'DATABASES["default"] = {database!r}\n')
    urls = block(GUIDE, "python", "urls.py")
    assert f'path("{host.prefix}", include("runs.urls"))' in urls, urls
    with host.file("urls.py").open("a") as file:
        file.write("\n" + urls)


def take_the_environment(host: Host) -> None:
    """The one line docs/design/deployment.md#settings says a settings module adds, last, to take
    the `RUNLEDGER_*` environment variables."""
    with host.settings.open("a") as file:
        file.write("\n" + block("design/deployment.md", "python", "settings.py"))


def add_the_app(host: Host, database: dict[str, Any] | None = None, **settings: Any) -> None:
    """The guide's settings and URLs (write_the_guides_lines) plus the settings this host chooses
    (the metrics bearer, short intervals for tests, and `settings`). asgi.py stays as startproject
    wrote it."""
    write_the_guides_lines(host, database)
    # FAST_INTERVALS are environment strings; a host writes numbers.
    chosen = {"RUNLEDGER_METRICS_TOKEN": METRICS_TOKEN}
    host.append_settings(chosen | {name: json.loads(value) for name, value in FAST_INTERVALS.items()} | settings)


def start_with_the_app(venv: Venv, parent: Path, database: dict[str, Any] | None = None, **settings: Any) -> Host:
    """start_project, then add_the_app with `database` and `settings`."""
    host = start_project(venv, parent)
    add_the_app(host, database, **settings)
    return host


def wrap_the_application(host: Host) -> None:
    """The guide's ASGI application, the app's wrapper, in place of startproject's last line of asgi.py."""
    _replace_once(host.file("asgi.py"), "application = get_asgi_application()\n", block(GUIDE, "python", "asgi.py"))


def copy_site(venv: Venv, folder: Path) -> Host:
    """The standalone site as a folder of its own: config/, templates/ and manage.py as git holds
    them, without runs/ (the venv's wheel provides it), on a SQLite file there. It reads its
    settings from the environment: the short intervals too."""
    for path in checkout_files():
        if path == "manage.py" or path.startswith(("config/", "templates/")):
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / path, folder / path)
    env = clean_env(DATABASE_URL=f"sqlite:///{folder / 'site.sqlite3'}", **FAST_INTERVALS)
    return Host(folder=folder, venv=venv, prefix="", env=env)


def database_for(request: pytest.FixtureRequest, stack: contextlib.ExitStack[Any]) -> dict[str, Any] | None:
    """The database of a host for the fixture's `param`: None for "sqlite" (the host's own file),
    for "postgresql" a database of its own on the tests' server (own_database), dropped as `stack`
    closes."""
    if request.param != "postgresql":
        return None
    request.getfixturevalue("django_db_setup")
    with request.getfixturevalue("django_db_blocker").unblock():
        url = database_url()
    if not url.startswith("postgres"):
        pytest.fail("the PostgreSQL host needs the suite on PostgreSQL (DATABASE_URL=postgres://…)")
    return stack.enter_context(own_database(url))


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


# --- the guide's shell steps, as a reader types them -----------------------------------------------

# What a reader answers `manage.py createsuperuser`'s prompts (the e-mail address left empty).
SUPERUSER_ANSWERS = [
    ("Username", ADMIN),
    ("Email address", ""),
    ("Password: ", PASSWORD),
    ("Password (again)", PASSWORD),
]


@dataclass
class Followed:
    """A host after the guide's shell steps: each short command with what it printed, and the two
    long-running processes it started."""

    said: list[tuple[str, str]]
    web: Proc
    worker: Proc


def guide_commands() -> list[str]:
    """Every command of the guide's `sh` blocks, in page order, one a line (a reader's `# …` kept)."""
    lines = [line.strip() for b in code_blocks(GUIDE) if b.lang == "sh" for line in b.text.splitlines()]
    commands = [line for line in lines if line and not line.startswith("#")]
    assert not any(line.endswith("\\") for line in commands), "one command a line, no continuations"
    return commands


def follow_the_guide(procs: Procs, host: Host) -> Followed:
    """Run the guide's shell steps in the host's folder, in its virtualenv (its bin/ first on PATH,
    as `activate` leaves it), in order: the short ones with bash as written — `pip install` with the
    built wheel in place of the package index's `django-runledger`, `createsuperuser` on a terminal
    answering its prompts — and the two a reader leaves running, uvicorn and runworker, started as
    `procs` with exactly the guide's arguments (uvicorn's port from UVICORN_PORT, which it reads:
    8000 may be taken), each waited for until it serves."""
    env = host.env | {"PATH": f"{host.venv.root / 'bin'}:{os.environ['PATH']}", "VIRTUAL_ENV": str(host.venv.root)}
    said: list[tuple[str, str]] = []
    web = worker = None
    for line in guide_commands():
        args = shlex.split(line, comments=True)
        if args[0] == "uvicorn":
            port = free_port()
            web = procs.start("guide-uvicorn", args, env | {"UVICORN_PORT": str(port)}, port=port, cwd=host.folder)
            wait_http_ok(web, host.url("healthz/"), timeout=60)
        elif args[1:3] == ["manage.py", "runworker"]:
            worker = procs.start("guide-worker", args, env, cwd=host.folder)
            wait_log_line(worker, f"runworker {socket.gethostname()}:{worker.pid} ready", timeout=60)
        elif args[1:3] == ["manage.py", "createsuperuser"]:
            done = answer_prompts(["bash", "-c", line], SUPERUSER_ANSWERS, cwd=host.folder, env=env)
            assert done.returncode == 0 and "Superuser created successfully." in done.output, done.output
            said.append((line, done.output))
        else:
            if args[:2] == ["pip", "install"]:
                assert line.count("'django-runledger[") == 1, line
                line = line.replace("'django-runledger[", f"'{host.venv.wheel}[")
            ran = subprocess.run(
                ["bash", "-c", line], cwd=host.folder, env=env, capture_output=True, text=True, timeout=540
            )
            assert ran.returncode == 0, f"{line}:\n{ran.stdout[-3000:]}\n{ran.stderr[-3000:]}"
            said.append((line, ran.stdout + ran.stderr))
    assert web is not None and worker is not None, "the guide starts no uvicorn or no runworker"
    return Followed(said, web, worker)


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
