"""What `pip install django-runledger` gets: the whole app and nothing of the standalone site, a licence,
metadata with one version, and a core install that needs none of the extras to serve the app."""

import re
from pathlib import Path

import pytest
from django.template.loader import get_template

import runs
from tests.support.package import Built, app_files, build, checkout_files, core_install
from tests.support.procs import ROOT

# What the repository holds besides the app: none of it belongs in a distribution of the app.
NOT_THE_APP = ("config/", "templates/", "tests/", "bench/", "bin/", "deploy/", "clients/", "manage.py")
# The extras' distributions, and the core install's (no extras).
EXTRA_DISTRIBUTIONS = {"uvicorn", "psycopg", "pyzmq", "pyjwt", "openai"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build(tmp_path_factory.mktemp("package"))


def requirement_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()


@pytest.mark.processes
@pytest.mark.timeout(600)
def test_the_wheel_holds_every_file_of_the_app_and_nothing_else(built: Built) -> None:
    files = built.wheel_files()
    app = app_files()
    # The kinds that went missing before (a listing of top-level modules only): not vacuous.
    for kind in ("runs/migrations/0001_initial.py", "runs/services/", "runs/templates/runs/", "runs/static/runs/"):
        assert any(path.startswith(kind) for path in app), kind
    dist_info = {path for path in files if path.split("/")[0].endswith(".dist-info")}
    assert files - dist_info == app
    assert f"django_runledger-{runs.__version__}.dist-info/licenses/LICENSE" in files


@pytest.mark.processes
@pytest.mark.timeout(600)
def test_the_sdist_holds_the_app_its_licence_and_changelog_and_no_site(built: Built) -> None:
    files = built.sdist_files()
    assert {path for path in files if path.startswith("runs/")} == app_files()
    assert {"LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml"} <= files
    assert [path for path in files if path.startswith(NOT_THE_APP)] == []


@pytest.mark.processes
@pytest.mark.timeout(600)
def test_the_metadata_has_the_licence_one_version_and_the_extras(built: Built) -> None:
    meta = built.metadata()
    assert meta["License-Expression"] == "MIT"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert meta["Version"] == runs.__version__
    assert f"## [{runs.__version__}]" in (ROOT / "CHANGELOG.md").read_text()
    assert "Framework :: Django :: 5.2" in meta.get_all("Classifier")
    assert meta.get_all("Project-URL")

    requires = meta.get_all("Requires-Dist")
    core = {requirement_name(r) for r in requires if "extra ==" not in r}
    assert {"django", "djangorestframework", "drf-spectacular", "httpx", "prometheus-client"} <= core
    assert core & EXTRA_DISTRIBUTIONS == set()
    assert {"server", "postgres", "edge", "openai", "all", "docs", "dev"} <= set(meta.get_all("Provides-Extra"))
    extra_of = {
        requirement_name(r): r.rsplit('extra == "', 1)[1].rstrip('"')
        for r in requires
        if "extra ==" in r and not r.startswith("django-runledger")
    }
    assert {extra_of[name] for name in ("uvicorn", "psycopg", "pyzmq", "pyjwt")} == {"server", "postgres", "edge"}
    assert 'django-runledger[edge,openai,postgres,server]; extra == "all"' in requires
    assert 'django-runledger[all,docs]; extra == "dev"' in requires


@pytest.mark.sqlite
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "module",
    [
        "runs.urls",
        # The staff console (the dashboard's view too), and the worker on SQLite.
        "runs.admin.dashboard",
        "runs.management.commands.runworker",
        # An ASGI lifespan hook imports the publisher in every web process, with an edge or not.
        "runs.streaming.edge.publisher",
    ],
)
def test_a_core_install_imports_none_of_the_extras(module: str, tmp_path: Path) -> None:
    report = core_install(tmp_path, module)
    assert report["error"] is None, report["error"]["traceback"]
    # Others may try and do without (DRF's PostgreSQL fields); the app never asks.
    assert [attempt for attempt in report["attempts"] if attempt["by"].split(".")[0] == "runs"] == []
    assert report["loaded"] == []


@pytest.mark.sqlite
@pytest.mark.timeout(120)
def test_an_edge_configured_without_its_extra_is_refused_naming_the_extra(tmp_path: Path) -> None:
    report = core_install(
        tmp_path,
        call="runs.streaming.edge.publisher:require_edge",
        settings={"RUNLEDGER_GRIP_URL": ["ipc:///run/edge/control"]},
    )
    assert report["error"] is not None
    assert report["error"]["type"] == "ImproperlyConfigured"
    assert report["error"]["message"] == (
        "RUNLEDGER_GRIP_URL needs the edge extra (pip install 'django-runledger[edge]'): no jwt, zmq"
    )


@pytest.mark.sqlite
@pytest.mark.timeout(60)
def test_the_apps_templates_are_found_in_the_app_and_the_site_overrides_none() -> None:
    templates = ROOT / "runs" / "templates"
    names = [path.removeprefix("runs/templates/") for path in checkout_files() if path.startswith("runs/templates/")]
    assert "runs/run_list.html" in names and "admin/runs/dashboard.html" in names
    for name in names:
        assert Path(get_template(name).origin.name) == templates / name
    site = {path.removeprefix("templates/") for path in checkout_files() if path.startswith("templates/")}
    assert site & set(names) == set()
