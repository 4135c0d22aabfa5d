"""What `pip install django-runledger` gets: the whole app and nothing of the standalone site, a licence,
metadata with one version, and a core install that needs none of the extras to serve the app. And
what the package index shows of both distributions, the app's and the client's (runledger-client):
their names, versions, licence, classifiers, project URLs and descriptions whose links all work
there, and the `py.typed` that gives their users the types."""

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import trove_classifiers
from django.template.loader import get_template
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import runledger_client
import runs
from tests.support.descriptions import REPOSITORY, description_links, links_that_lead_nowhere, repository_path
from tests.support.package import Built, app_files, built_for_the_run, checkout_files, core_install
from tests.support.procs import ROOT

# What the repository holds besides the app: none of it belongs in a distribution of the app.
NOT_THE_APP = ("config/", "templates/", "tests/", "bench/", "bin/", "deploy/", "clients/", "manage.py")
# The extras' distributions, and the core install's (no extras).
EXTRA_DISTRIBUTIONS = {"uvicorn", "psycopg", "pyzmq", "pyjwt", "django-cors-headers", "openai"}


@dataclass(frozen=True)
class Distribution:
    project: str  # the folder of its pyproject.toml and README.md, in the checkout
    name: str
    version: str  # the one its import package states
    package: str


DISTRIBUTIONS = [
    Distribution(".", "django-runledger", runs.__version__, "runs"),
    Distribution("clients/python", "runledger-client", runledger_client.__version__, "runledger_client"),
]
# The labels the package index shows with their icons (PEP 753's well-known labels).
PROJECT_URLS = {"Homepage", "Documentation", "Changelog", "Issues"}


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Built]:
    """Each distribution built once for the run, when a test first asks for it."""

    @functools.cache
    def made(project: str) -> Built:
        return built_for_the_run(tmp_path_factory, project)

    return made


@pytest.fixture(scope="module")
def built(builds: Callable[[str], Built]) -> Built:
    return builds(".")


@pytest.fixture(params=DISTRIBUTIONS, ids=lambda distribution: distribution.name)
def distribution(request: pytest.FixtureRequest) -> Distribution:
    """Each distribution in turn: a test that asks for it runs for the app and for the client."""
    chosen: Distribution = request.param
    return chosen


@pytest.fixture
def its_build(distribution: Distribution, builds: Callable[[str], Built]) -> Built:
    return builds(distribution.project)


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


@pytest.mark.processes
@pytest.mark.timeout(600)
def test_the_sdist_holds_the_app_its_licence_and_changelog_and_no_site(built: Built) -> None:
    files = built.sdist_files()
    assert {path for path in files if path.startswith("runs/")} == app_files()
    assert {"LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml"} <= files
    assert [path for path in files if path.startswith(NOT_THE_APP)] == []


@pytest.mark.processes
@pytest.mark.timeout(600)
def test_the_metadata_has_one_version_and_the_extras(built: Built) -> None:
    meta = built.metadata()
    assert meta["Version"] == runs.__version__
    assert f"## [{runs.__version__}]" in (ROOT / "CHANGELOG.md").read_text()
    assert "Framework :: Django :: 5.2" in meta.get_all("Classifier")

    requires = meta.get_all("Requires-Dist")
    core = {requirement_name(r) for r in requires if "extra ==" not in r}
    assert {"django", "djangorestframework", "drf-spectacular", "httpx", "prometheus-client"} <= core
    assert core & EXTRA_DISTRIBUTIONS == set()
    assert {"server", "postgres", "edge", "cors", "openai", "all", "docs", "dev"} <= set(meta.get_all("Provides-Extra"))
    extra_of = {
        requirement_name(r): r.rsplit('extra == "', 1)[1].rstrip('"')
        for r in requires
        if "extra ==" in r and not r.startswith("django-runledger")
    }
    assert {extra_of[name] for name in ("uvicorn", "psycopg", "pyzmq", "pyjwt")} == {"server", "postgres", "edge"}
    assert extra_of["django-cors-headers"] == "cors"
    assert 'django-runledger[cors,edge,openai,postgres,server]; extra == "all"' in requires
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


@pytest.mark.processes
@pytest.mark.timeout(600)
def test_each_distribution_names_itself_its_version_and_its_licence_in_the_wheel_and_the_sdist(
    distribution: Distribution, its_build: Built
) -> None:
    licence = (ROOT / "LICENSE").read_text()
    assert licence.startswith("MIT License")
    for meta in (its_build.metadata(), its_build.sdist_metadata()):
        assert meta["Name"] == distribution.name
        assert meta["Version"] == distribution.version
        assert Version(meta["Metadata-Version"]) >= Version("2.4")  # the first with License-Expression
        assert meta["License-Expression"] == "MIT"
        assert meta.get_all("License-File") == ["LICENSE"]
    # The repository's licence, word for word, where each metadata says it is.
    assert its_build.wheel_text(f"{its_build.dist_info()}/licenses/LICENSE") == licence
    assert its_build.sdist_text("LICENSE") == licence


@pytest.mark.processes
@pytest.mark.timeout(600)
def test_each_wheel_ships_py_typed(distribution: Distribution, its_build: Built) -> None:
    marker = f"{distribution.package}/py.typed"
    assert (ROOT / distribution.project / marker).is_file()
    assert marker in its_build.wheel_files()
    assert marker in its_build.sdist_files()


@pytest.mark.processes
@pytest.mark.timeout(600)
def test_each_distribution_is_classified_linux_typed_and_for_its_pythons_with_classifiers_the_index_accepts(
    distribution: Distribution, its_build: Built
) -> None:
    meta = its_build.metadata()
    classifiers = meta.get_all("Classifier")
    assert {"Operating System :: POSIX :: Linux", "Typing :: Typed"} <= set(classifiers)
    # The oldest Python it installs on is named, and none it refuses.
    supported = SpecifierSet(meta["Requires-Python"])
    pythons = [
        c.rsplit(" :: ", 1)[1] for c in classifiers if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    assert pythons and all(supported.contains(version) for version in pythons), (meta["Requires-Python"], pythons)
    oldest = min(f"3.{minor}" for minor in range(20) if supported.contains(f"3.{minor}"))
    assert oldest in pythons
    # A licence classifier beside License-Expression is refused by the index (PEP 639).
    assert [c for c in classifiers if c.startswith("License ::")] == []
    assert set(classifiers) - trove_classifiers.classifiers == set()
    assert set(classifiers) & set(trove_classifiers.deprecated_classifiers) == set()


@pytest.mark.processes
@pytest.mark.timeout(600)
def test_each_description_is_its_readme_with_every_link_in_full(distribution: Distribution, its_build: Built) -> None:
    meta = its_build.metadata()
    assert meta["Description-Content-Type"].startswith("text/markdown")
    description = meta.get_payload()
    assert description.strip() == (ROOT / distribution.project / "README.md").read_text().strip()
    links = description_links(description)
    assert [link for link in links if link.startswith(REPOSITORY)], links  # not vacuous: it links the repository
    assert links_that_lead_nowhere(description) == []


@pytest.mark.processes
@pytest.mark.timeout(600)
def test_each_distribution_links_its_project_urls_into_the_repository(
    distribution: Distribution, its_build: Built
) -> None:
    labelled = dict(entry.split(", ", 1) for entry in its_build.metadata().get_all("Project-URL"))
    assert set(labelled) >= PROJECT_URLS, labelled
    for label, address in labelled.items():
        assert address.startswith(REPOSITORY), (label, address)
        repository_path(address)  # names what the checkout has, when it names a file or a folder
    assert repository_path(labelled["Homepage"]) == ROOT
    assert repository_path(labelled["Changelog"]) == ROOT / "CHANGELOG.md"


@pytest.mark.sqlite
@pytest.mark.timeout(60)
def test_a_link_that_leads_nowhere_on_the_index_is_found_however_it_is_written() -> None:
    # What would creep back into a README: each kind of relative link, and a heading it lacks.
    description = (
        "# Title\n\n## Install\n\n"
        "[inline](docs/tutorial.md) [full](https://example.com/a) [reference][ref] <https://example.com/b>\n"
        "![image](docs/logo.png) [heading](#install) [missing heading](#nowhere) [up](../../README.md)\n"
        '<a href="LICENSE">raw</a> [mail](mailto:a@example.com)\n\n'
        "[ref]: CHANGELOG.md\n"
    )
    assert links_that_lead_nowhere(description) == [
        "docs/tutorial.md",
        "CHANGELOG.md",
        "docs/logo.png",
        "#user-content-nowhere",
        "../../README.md",
        "LICENSE",
    ]
