"""The proof that `runs` is an app any Django project can install: the built wheel, in a fresh
virtualenv, added to a project made by `django-admin startproject` with the lines
docs/how-to/embed.md says a host adds (read from the page), serves the API, the streams, cancellation, the admin, the dashboard and /metrics/ under the
host's stock ASGI handler, on SQLite and on PostgreSQL; a bad setting is refused with the
registry's message; its `RUNLEDGER_*` environment is read by the one line that takes it (a bad value
refused by name) and warned of by `check` where nothing takes it; and the standalone site (config/)
runs from the same wheel."""

import hashlib
import re
import sqlite3
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support import host as hosts
from tests.support.host import Host, Venv
from tests.support.package import built_for_the_run
from tests.support.procs import Proc, Procs
from tests.support.waiting import wait_until

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    folder = tmp_path_factory.mktemp("venv")
    built = built_for_the_run(tmp_path_factory)
    venv = hosts.make_venv(folder / "venv", built.wheel)
    venv.install("server,postgres")
    return venv


@dataclass
class Served:
    host: Host
    web: Proc
    worker: Proc
    token: str
    checked: str

    def api(self) -> httpx.Client:
        return hosts.api(self.web, self.token)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def served(request: pytest.FixtureRequest, venv: Venv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A fresh host on the database `param`, migrated, with a superuser and their API token, its
    uvicorn and worker running (each test makes its own runs)."""
    folder = tmp_path_factory.mktemp(f"host-{request.param}")
    with ExitStack() as stack:
        database = hosts.database_for(request, stack)
        host = hosts.start_with_the_app(venv, folder, database)
        checked = host.must("check")
        host.must("migrate")
        token = host.create_admin_token()
        # Stopped before the database is dropped (the stack unwinds last in, first out).
        procs = Procs(folder)
        stack.callback(procs.stop_all)
        yield Served(host, hosts.start_web(procs, host), hosts.start_worker(procs, host), token, checked)


@pytest.mark.timeout(600)
def test_the_host_checks_clean_and_runs_the_wheels_app_from_its_own_folder(served: Served, venv: Venv) -> None:
    assert served.checked.strip().splitlines()[-1] == hosts.NO_ISSUES
    where = served.host.run("-c", "import runs, config; print(runs.__file__); print(config.__file__)")
    runs_file, config_file = where.stdout.split()
    assert Path(runs_file).is_relative_to(venv.root), runs_file
    assert Path(config_file).is_relative_to(served.host.folder), config_file
    assert (served.host.folder / "config" / "asgi.py").read_text().endswith("application = get_asgi_application()\n")
    for proc in (served.web, served.worker):
        assert hosts.working_directory(proc) == served.host.folder


@pytest.mark.timeout(120)
def test_a_demo_run_created_by_token_streams_to_its_end(served: Served) -> None:
    run_id = hosts.create_demo_run(served.api(), served.host, deltas=5, delay_ms=20)
    stream, events = hosts.stream_to_end(served.web, served.host, run_id, served.token)
    assert stream.status == 200
    assert stream.headers["content-type"].startswith("text/event-stream")
    assert [event.seq for event in events] == list(range(1, len(events) + 1))
    assert events[-1].event == "run.completed"
    assert [event.json()["data"]["text"] for event in events if event.event == "output.delta"] == [
        f"chunk {i} " for i in range(5)
    ]


@pytest.mark.timeout(120)
def test_a_running_run_cancelled_ends_with_one_run_cancelled(served: Served) -> None:
    client = served.api()
    run_id = hosts.create_demo_run(client, served.host, deltas=500, delay_ms=50)
    run = served.host.url(f"api/runs/{run_id}/")
    wait_until(lambda: client.get(run).json()["status"] == "running", timeout=30, what="the worker's claim")

    cancelled = client.post(run + "cancel/", json={"note": "from the host"})
    assert cancelled.status_code == 200, cancelled.text
    wait_until(lambda: client.get(run).json()["status"] == "cancelled", timeout=30, what="the cancel")
    page = client.get(run + "events/", params={"limit": 1000}).json()
    assert page["end_of_stream"], page
    assert [event["type"] for event in page["results"]].count("run.cancelled") == 1
    assert page["results"][-1]["type"] == "run.cancelled"


@pytest.mark.timeout(120)
def test_a_superuser_opens_the_run_list_and_a_run_in_the_admin(served: Served) -> None:
    run_id = hosts.create_demo_run(served.api(), served.host, deltas=1, delay_ms=0)
    admin = hosts.signed_in_admin(served.web)
    listing = admin.get("/admin/runs/run/")
    assert listing.status_code == 200
    assert f"/admin/runs/run/{run_id}/change/" in listing.text
    assert "Django administration" in listing.text  # the host's admin keeps its own branding
    change = admin.get(f"/admin/runs/run/{run_id}/change/")
    assert change.status_code == 200
    assert run_id in change.text


@pytest.mark.timeout(120)
def test_the_watch_page_reaches_the_api_under_the_hosts_prefix(served: Served) -> None:
    run_id = hosts.create_demo_run(served.api(), served.host, deltas=1, delay_ms=0)
    page = hosts.signed_in_admin(served.web).get(served.host.url(f"runs/{run_id}/"))
    assert page.status_code == 200, page.text
    # The page's client is mounted where this URL begins, the host's prefix: it reads and commands
    # the run under it too (the embed guide's test follows a run there in a browser).
    assert f'data-stream-url="{served.host.url(f"api/runs/{run_id}/stream/")}"' in page.text


@pytest.mark.timeout(120)
def test_the_schema_names_every_path_under_the_hosts_prefix(served: Served) -> None:
    with httpx.Client(base_url=served.web.url, timeout=20) as client:
        schema = client.get(served.host.url("api/schema/"), params={"format": "json"}).json()
    assert [path for path in schema["paths"] if not path.startswith(served.host.url("api/"))] == []
    stream = served.host.url("api/runs/{run_id}/stream/")
    assert {stream, served.host.url("api/runs/{run_id}/wait/")} <= set(schema["paths"])
    run_id = hosts.create_demo_run(served.api(), served.host, deltas=1, delay_ms=0)
    with served.api() as client, client.stream("GET", stream.format(run_id=run_id)) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")


@pytest.mark.timeout(120)
def test_the_admin_index_links_to_the_dashboard(served: Served) -> None:
    admin = hosts.signed_in_admin(served.web)
    index = admin.get("/admin/")
    assert index.status_code == 200
    # The admin lists it as it lists a model: by its name and by a "View" link, the same href.
    assert "/admin/runs/dashboard/" in hosts.links(index.text)
    dashboard = admin.get("/admin/runs/dashboard/")
    assert dashboard.status_code == 200
    assert 'id="rl-dashboard"' in dashboard.text


@pytest.mark.timeout(120)
def test_metrics_answer_the_hosts_bearer_and_refuse_a_caller_without_it(served: Served) -> None:
    hosts.create_demo_run(served.api(), served.host, deltas=1, delay_ms=0)
    metrics = served.host.url("metrics/")
    with httpx.Client(base_url=served.web.url, timeout=20) as client:
        scraped = client.get(metrics, headers={"Authorization": f"Bearer {hosts.METRICS_TOKEN}"})
        refused = client.get(metrics)
    assert scraped.status_code == 200, scraped.text
    assert re.search(r'^runledger_runs\{status="\w+"\} [1-9]', scraped.text, re.MULTILINE), scraped.text
    assert refused.status_code in (401, 403)


@pytest.mark.timeout(300)
def test_the_guides_asgi_wrapper_serves_the_host_and_counts_its_requests(
    venv: Venv, tmp_path: Path, procs: Procs
) -> None:
    host = hosts.start_with_the_app(venv, tmp_path)
    hosts.wrap_the_application(host)
    assert host.must("check").strip().splitlines()[-1] == hosts.NO_ISSUES
    host.must("migrate")
    token = host.create_admin_token()
    web, _ = hosts.start_web(procs, host), hosts.start_worker(procs, host)

    run_id = hosts.create_demo_run(hosts.api(web, token), host, deltas=3, delay_ms=10)
    stream, events = hosts.stream_to_end(web, host, run_id, token)
    assert stream.status == 200 and events[-1].event == "run.completed"
    assert [event.seq for event in events] == list(range(1, len(events) + 1))
    # Requests counted by status: the wrapper's, which the stock handler does not count.
    with httpx.Client(base_url=web.url, timeout=20) as client:
        scraped = client.get(host.url("metrics/"), headers={"Authorization": f"Bearer {hosts.METRICS_TOKEN}"})
    assert scraped.status_code == 200, scraped.text
    created = re.search(r'^runledger_http_requests_total\{status="201"\} (\S+)$', scraped.text, re.MULTILINE)
    assert created is not None and float(created.group(1)) >= 1, scraped.text


@pytest.mark.timeout(300)
def test_a_bad_setting_value_is_refused_by_check_and_runworker_with_the_registrys_message(
    venv: Venv, tmp_path: Path
) -> None:
    host = hosts.start_with_the_app(venv, tmp_path, RUNLEDGER_LEASE_SECONDS="soon")
    checked = host.manage("check")
    assert checked.returncode != 0
    (line,) = [line for line in checked.stderr.splitlines() if "(runs.E002)" in line]
    message = line.split("(runs.E002)", 1)[1].strip()
    assert message.startswith("RUNLEDGER_LEASE_SECONDS") and "'soon'" in message, line

    # As the system check refuses it, and on its own under --skip-checks (conf.require()).
    for skip in ([], ["--skip-checks"]):
        worker = host.manage("runworker", "--once", *skip)
        assert worker.returncode != 0
        assert message in worker.stderr, worker.stderr


def conf_values(host: Host, env: dict[str, str], *names: str) -> list[str]:
    """What the host's app reads for `names` (conf.NAME), one line each, started with `env`."""
    script = "from runs.conf import conf; " + "; ".join(f"print(conf.{name})" for name in names)
    return host.must("shell", "-c", script, env=env).splitlines()[-len(names) :]


@pytest.mark.timeout(300)
def test_a_host_that_takes_the_environment_reads_a_good_value_and_check_refuses_a_bad_one_by_name(
    venv: Venv, tmp_path: Path
) -> None:
    host = hosts.start_with_the_app(venv, tmp_path, RUNLEDGER_MAX_STREAMS_PER_USER=3)
    hosts.take_the_environment(host)
    good = host.env | {
        "RUNLEDGER_MAX_STREAMS_PER_USER": "7",
        "RUNLEDGER_AGENTS": "runs.agents.demo, runs.agents.openai_chat",
    }
    assert host.must("check", env=good).strip().splitlines()[-1] == hosts.NO_ISSUES
    # The environment wins over what settings.py set before the line; a list is comma-separated.
    assert conf_values(host, good, "MAX_STREAMS_PER_USER", "AGENTS") == [
        "7",
        "['runs.agents.demo', 'runs.agents.openai_chat']",
    ]
    # Without the variable, settings.py's own value.
    assert conf_values(host, host.env, "MAX_STREAMS_PER_USER") == ["3"]

    bad = host.env | {"RUNLEDGER_AGENTS": "my agents"}
    refusal = "RUNLEDGER_AGENTS must be a list of module paths, not 'my agents'"
    for command in (["check"], ["runworker", "--once", "--skip-checks"]):
        refused = host.manage(*command, env=bad)
        assert refused.returncode != 0, command
        assert refused.stderr.strip().splitlines()[-1].endswith(refusal), refused.stderr


@pytest.mark.timeout(300)
def test_check_warns_a_host_that_ignores_its_environment_naming_the_variables_never_their_values(
    venv: Venv, tmp_path: Path
) -> None:
    host = hosts.start_with_the_app(venv, tmp_path)
    secret = "a-metrics-bearer-never-shown"
    env = host.env | {
        "RUNLEDGER_AGENTS": "my agents",  # ignored, so never refused: the warning is what tells
        "RUNLEDGER_METRICS_TOKEN": secret,
        "RUNLEDGER_LEASE_SECONDS": "2",  # what settings.py holds (the test's short intervals): in effect
        "RUNLEDGER_URL": "http://127.0.0.1:8000",  # the client's, not a setting
    }
    checked = host.manage("check", env=env)
    assert checked.returncode == 0, checked.stderr
    (warning,) = [line for line in checked.stderr.splitlines() if "(runs.W001)" in line]
    assert "RUNLEDGER_AGENTS, RUNLEDGER_METRICS_TOKEN are set in the environment, and ignored" in warning, warning
    assert secret not in checked.stdout + checked.stderr
    assert host.manage("check", "--fail-level", "WARNING", env=env).returncode != 0
    assert conf_values(host, env, "AGENTS") == ["['runs.agents.demo']"]


@pytest.mark.timeout(300)
def test_a_host_whose_own_apis_keep_drfs_tokens_keeps_them_when_runledger_takes_their_digests(
    venv: Venv, tmp_path: Path
) -> None:
    # A host upgrading from a release that asked for DRF's token app, and keeping it for its own APIs.
    host = hosts.start_with_the_app(venv, tmp_path)
    with host.settings.open("a") as settings:
        settings.write('INSTALLED_APPS += ["rest_framework.authtoken"]\n')
    (before,) = [line.split()[-1] for line in host.must("showmigrations", "runs").splitlines() if "_api_tokens" in line]
    host.must("migrate", "runs", previous_migration(host, before))
    for app in ("contenttypes", "auth", "admin", "sessions", "authtoken"):  # all but runs, to their last
        host.must("migrate", app)
    superuser = ["createsuperuser", "--noinput", "--username", hosts.ADMIN, "--email", "a@example.com"]
    host.must(*superuser, env=host.env | {"DJANGO_SUPERUSER_PASSWORD": hosts.PASSWORD})
    key = host.must("drf_create_token", hosts.ADMIN).split()[2]  # "Generated token KEY for user admin"

    host.must("migrate")

    with sqlite3.connect(host.folder / "db.sqlite3") as db:
        assert db.execute("SELECT key FROM authtoken_token").fetchall() == [(key,)]  # the host's own, kept
        digests = db.execute("SELECT digest, name FROM runs_apitoken").fetchall()
    assert digests == [(hashlib.sha256(key.encode()).hexdigest(), "migrated")]
    asked = host.must(
        "shell",
        "-c",
        "from django.test import Client; "
        f"print(Client(SERVER_NAME='localhost', HTTP_AUTHORIZATION='Token {key}').get('/{host.prefix}api/runs/').status_code)",
    )
    assert asked.splitlines()[-1] == "200"  # the key works on Runledger's API too


def previous_migration(host: Host, name: str) -> str:
    """The runs migration before `name` (showmigrations lists them in order)."""
    names = [line.split()[-1] for line in host.must("showmigrations", "runs").splitlines()[1:]]
    return names[names.index(name) - 1]


@pytest.mark.timeout(600)
def test_the_standalone_site_runs_from_the_wheel(venv: Venv, tmp_path: Path, procs: Procs) -> None:
    # Its own opinions need every extra (the edge's too): what bin/run and the production guide install.
    venv.install("all")
    site = hosts.copy_site(venv, tmp_path)
    assert not (site.folder / "runs").exists()
    assert site.must("check").strip().splitlines()[-1] == hosts.NO_ISSUES
    site.must("migrate")
    token = site.create_admin_token()
    web, _ = hosts.start_web(procs, site), hosts.start_worker(procs, site)

    with httpx.Client(base_url=web.url, timeout=20) as client:
        assert client.get("/healthz/").status_code == 200
        assert client.get("/accounts/login/").status_code == 200
        admin = client.get("/admin/")
        assert admin.status_code == 302 and admin.headers["location"].startswith("/admin/login/")
        # Its own branding (templates/admin/base_site.html), which a host's admin never gets.
        assert "Runledger administration" in client.get(admin.headers["location"]).text
    run_id = hosts.create_demo_run(hosts.api(web, token), site, deltas=3, delay_ms=10)
    stream, events = hosts.stream_to_end(web, site, run_id, token)
    assert stream.status == 200
    assert [event.seq for event in events] == list(range(1, len(events) + 1))
    assert events[-1].event == "run.completed"
