"""The settings registry (runs/conf.py): every RUNLEDGER_* setting declared once, read with
its default where a project sets none, refused with the registry's message wherever it is set wrong —
from the environment at settings load, in code by the system check and by every process at start
under --skip-checks — variables a project's settings ignore warned of by name, and the docs'
reference made from the same declarations."""

import hashlib
import hmac
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from pytest_django import Settings

from config.environment import Site
from runs.conf import AppSettings, check_environment, check_settings, settings_from_environment
from tests.support.package import in_a_bare_host
from tests.support.procs import ROOT, subprocess_env, uvicorn_refusal

# One bad value of each kind, as the environment gives it: the variable, its text, and what the
# message refusing it says (a secret's message never repeats it).
BAD_TEXT = {
    "RUNLEDGER_WORKER_CONCURRENCY": ("0", "must be a whole number ≥ 1, not '0'"),
    "RUNLEDGER_MAX_STREAMS_PER_USER": ("-1", "must be a whole number ≥ 0 (0 = unlimited), not '-1'"),
    "RUNLEDGER_POLL_SECONDS": ("soon", "must be a number of seconds above 0, not 'soon'"),
    "RUNLEDGER_WORKER_LISTEN": ("maybe", "must be on or off: 1 or 0, true or false, yes or no, not 'maybe'"),
    "RUNLEDGER_LOG_FORMAT": ("xml", "must be text or json, not 'xml'"),
    "RUNLEDGER_AGENTS": (
        "runs.agents.demo,my agents",
        "must be a list of module paths, not 'runs.agents.demo,my agents'",
    ),
    "RUNLEDGER_GRIP_URL": ("http://127.0.0.1:5561", "must be a list of ipc:///PATH URLs"),
    "RUNLEDGER_OPENAI_BASE_URL": ("api.example.com/v1", "must be an http:// or https:// URL, not 'api.example.com/v1'"),
    "RUNLEDGER_GRIP_KEY": ("file:/etc/runledger/grip-key-of-40-characters", "must be at least 32 characters of"),
    # The standalone site's own variables (config/environment.py), refused alike.
    "RUNLEDGER_DB_POOL_SIZE": ("lots", "must be a whole number ≥ 0 (0 = no pool), not 'lots'"),
}
SECRET = "file:/etc/runledger/grip-key-of-40-characters"

# One bad value of each kind as a project's settings module sets it, and the registry's message.
BAD_VALUE = {
    "RUNLEDGER_WORKER_CONCURRENCY": (0, "must be a whole number ≥ 1, not 0"),
    "RUNLEDGER_MAX_STREAMS_PER_USER": (-2, "must be a whole number ≥ 0 (0 = unlimited), not -2"),
    "RUNLEDGER_SSE_MAX_SECONDS": ("300", "must be a number of seconds ≥ 0 (0 = unlimited), not '300'"),
    "RUNLEDGER_WORKER_LISTEN": ("no", "must be on or off: 1 or 0, true or false, yes or no, not 'no'"),
    "RUNLEDGER_LOG_FORMAT": ("JSON", "must be text or json, not 'JSON'"),
    "RUNLEDGER_TOOL_ENV": ("HOME", "must be a list of environment variable names, not 'HOME'"),
    "RUNLEDGER_GRIP_URL": (["ipc://relative/path"], "must be a list of ipc:///PATH URLs"),
    "RUNLEDGER_OPENAI_BASE_URL": (
        "ftp://models.example",
        "must be an http:// or https:// URL, not 'ftp://models.example'",
    ),
    "RUNLEDGER_METRICS_TOKEN": (12345, "must be text"),
}


RUNEDGE = ("manage.py", "runedge", "--skip-checks", "--port", "1", "--upstream", "127.0.0.1:1")


def _messages(bad: dict[str, tuple[Any, str]]) -> list[str]:
    return [f"{name} {said}" for name, (_, said) in bad.items()]


def _run(*command: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *command], cwd=ROOT, env=subprocess_env(**env), capture_output=True, text=True, timeout=60
    )


# --- from the environment, at settings load ----------------------------------------------------------


@pytest.mark.sqlite
@pytest.mark.timeout(120)
def test_a_bad_value_of_each_kind_in_the_environment_stops_every_process_at_settings_load() -> None:
    env = {name: text for name, (text, _) in BAD_TEXT.items()}
    for command in (["manage.py", "check"], ["manage.py", "runworker", "--skip-checks"], ["-c", "import config.asgi"]):
        refused = _run(*command, **env)
        assert refused.returncode != 0
        last = refused.stderr.strip().splitlines()[-1]
        assert last.startswith("django.core.exceptions.ImproperlyConfigured: "), refused.stderr
        for message in _messages(BAD_TEXT):
            assert message in last, (command, message, last)
        assert SECRET not in refused.stderr


@pytest.mark.sqlite
@pytest.mark.timeout(10)
def test_the_environment_text_of_each_kind_is_read_as_its_declaration_says() -> None:
    read = AppSettings(
        {
            "RUNLEDGER_LEASE_SECONDS": "2.5",
            "RUNLEDGER_MAX_RUNNING_PER_USER": "0",
            "RUNLEDGER_MAX_STREAMS_PER_USER": "7",
            "RUNLEDGER_WORKER_LISTEN": "off",
            "RUNLEDGER_OPENAI_CONTINUE": "Yes",
            "RUNLEDGER_TOOL_ENV": " HTTPS_PROXY, ,NO_PROXY ",
            "RUNLEDGER_GRIP_URL": "",
            "RUNLEDGER_METRICS_TOKEN": "",
            "RUNLEDGER_LOG_FORMAT": "",
        }
    )
    assert read.value_problems() == []
    assert read.LEASE_SECONDS == 2.5
    assert read.MAX_RUNNING_PER_USER is None  # 0: unlimited
    assert read.MAX_STREAMS_PER_USER == 7
    assert (read.WORKER_LISTEN, read.OPENAI_CONTINUE) == (False, True)
    assert read.TOOL_ENV == ["HTTPS_PROXY", "NO_PROXY"]
    assert read.GRIP_URL == []
    # Empty text is the default, so an environment file may list a variable it leaves unset.
    assert (read.METRICS_TOKEN, read.LOG_FORMAT) == ("", "text")
    assert read.given()["RUNLEDGER_MAX_STREAMS_PER_USER"] == 7
    assert "RUNLEDGER_HEARTBEAT_SECONDS" not in read.given()  # unset: the app's default, not the site's


@pytest.mark.sqlite
@pytest.mark.timeout(10)
def test_a_settings_module_takes_the_environment_in_one_call_refused_by_the_variables_name() -> None:
    taken = settings_from_environment({"RUNLEDGER_MAX_STREAMS_PER_USER": "7", "RUNLEDGER_URL": "http://x"})
    assert taken == {"RUNLEDGER_MAX_STREAMS_PER_USER": 7}  # the client's variable is no setting
    with pytest.raises(
        ImproperlyConfigured, match=r"^RUNLEDGER_AGENTS must be a list of module paths, not 'my agents'$"
    ):
        settings_from_environment({"RUNLEDGER_AGENTS": "my agents"})


@pytest.mark.sqlite
@pytest.mark.timeout(10)
def test_check_warns_of_the_variables_the_settings_ignore_by_name_never_by_value(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.RUNLEDGER_POLL_SECONDS = 3
    environ = {
        "RUNLEDGER_POLL_SECONDS": "3.0",  # what the settings hold: in effect
        "RUNLEDGER_SWEEP_SECONDS": "5",  # the default the settings leave: in effect too
        "RUNLEDGER_LOG_FORMAT": "",  # empty text: the default
        "RUNLEDGER_AGENTS": "my agents",  # no setting takes it
        "RUNLEDGER_METRICS_TOKEN": "s3cret",  # another value than the settings'
        "RUNLEDGER_URL": "http://127.0.0.1:8000",  # the client's, not a setting
    }
    for name in [name for name in os.environ if name.startswith("RUNLEDGER_")]:
        monkeypatch.delenv(name)
    assert check_environment() == []
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    (warning,) = check_environment()
    assert warning.id == "runs.W001" and warning.level == checks.WARNING
    assert warning.msg.startswith("RUNLEDGER_AGENTS, RUNLEDGER_METRICS_TOKEN are set in the environment, and ignored")
    assert "s3cret" not in f"{warning.msg} {warning.hint}" and "my agents" not in warning.msg
    settings.RUNLEDGER_METRICS_TOKEN = "s3cret"
    assert "RUNLEDGER_METRICS_TOKEN" not in check_environment()[0].msg


# --- set in code: the system check, and every process under --skip-checks ---------------------------


@pytest.mark.sqlite
@pytest.mark.timeout(10)
def test_a_bad_value_of_each_kind_set_in_code_is_a_system_check_error_naming_it(settings: Settings) -> None:
    assert check_settings() == []
    for name, (value, _) in BAD_VALUE.items():
        setattr(settings, name, value)
    errors = check_settings()
    assert {error.id for error in errors} == {"runs.E002"}
    # One error for each, saying what it must be (a list's goes on to show the list).
    found = {message: [e.msg for e in errors if e.msg.startswith(message)] for message in _messages(BAD_VALUE)}
    assert all(len(said) == 1 for said in found.values()), found
    assert len(errors) == len(BAD_VALUE)
    assert not any("12345" in error.msg for error in errors)  # a secret is not repeated


@pytest.mark.sqlite
@pytest.mark.timeout(10)
def test_a_setting_read_is_kept_until_a_setting_changes_and_a_list_is_a_new_one_each_read(settings: Settings) -> None:
    conf = AppSettings()
    assert conf.MAX_ACTIVE_RUNS_PER_USER == 1000  # the default, read once and kept
    settings.RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER = 3  # as override_settings: setting_changed is sent
    assert conf.MAX_ACTIVE_RUNS_PER_USER == 3
    settings.RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER = 0
    assert conf.MAX_ACTIVE_RUNS_PER_USER is None  # 0: unlimited
    agents, kept = conf.AGENTS, list(conf.AGENTS)
    agents.append("changed by its reader")
    assert kept == conf.AGENTS


@pytest.mark.sqlite
@pytest.mark.timeout(10)
def test_settings_that_each_work_but_not_together_are_checked_once_each_is_right(settings: Settings) -> None:
    settings.RUNLEDGER_LEASE_SECONDS = 1
    assert [e.msg.split(":")[0] for e in check_settings()] == [
        "RUNLEDGER_LEASE_SECONDS 1 s is too short for RUNLEDGER_HEARTBEAT_SECONDS 10 s and "
        "RUNLEDGER_CANCEL_GRACE_SECONDS 0.5 s"
    ]
    # A value that is wrong by itself is reported alone: the rule would do arithmetic on it.
    settings.RUNLEDGER_HEARTBEAT_SECONDS = "often"
    assert [e.msg for e in check_settings()] == [
        "RUNLEDGER_HEARTBEAT_SECONDS must be a number of seconds above 0, not 'often'"
    ]


@pytest.mark.sqlite
@pytest.mark.processes
@pytest.mark.timeout(180)
def test_check_runworker_runedge_and_the_web_application_refuse_bad_values_set_in_code() -> None:
    env = subprocess_env(
        DJANGO_SETTINGS_MODULE="tests.support.code_settings",
        CODE_SETTINGS=json.dumps({name: value for name, (value, _) in BAD_VALUE.items()}),
    )
    expected = _messages(BAD_VALUE)

    def refused(*command: str) -> str:
        done = subprocess.run([sys.executable, *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode != 0, done.stdout + done.stderr
        return done.stderr

    checked = refused("manage.py", "check")
    assert all(f"(runs.E002) {message}" in checked for message in expected), checked
    with tempfile.TemporaryDirectory() as folder:
        processes = {
            "runworker": refused("manage.py", "runworker", "--skip-checks", "--once"),
            "runedge": refused(*RUNEDGE, "--control", f"{folder}/control"),
            "uvicorn": uvicorn_refusal(env).stderr,
        }
    for process, stderr in processes.items():
        last = stderr.strip().splitlines()[-1]
        assert last.startswith("django.core.exceptions.ImproperlyConfigured: "), (process, stderr)
        assert all(message in last for message in expected), (process, last)
        assert "12345" not in stderr


# --- a host project that sets none -------------------------------------------------------------------


@pytest.mark.sqlite
@pytest.mark.timeout(120)
def test_a_host_project_that_sets_no_runledger_setting_passes_its_checks_and_reads_every_default(
    tmp_path: Path,
) -> None:
    checked = in_a_bare_host(tmp_path, "manage.py", "check")
    assert checked.returncode == 0, checked.stderr
    assert "System check identified no issues" in checked.stdout

    show = (
        "import django, json; django.setup(); from runs.conf import AppSettings, conf; "
        "print(json.dumps({s.name: getattr(conf, s.name.removeprefix('RUNLEDGER_')) for s in AppSettings.declared()}))"
    )
    shown = in_a_bare_host(tmp_path, "-c", show)
    assert shown.returncode == 0, shown.stderr
    read = json.loads(shown.stdout.splitlines()[-1])
    assert list(read) == [s.name for s in AppSettings.declared()]
    for setting in AppSettings.declared():
        if not callable(setting.default):
            assert read[setting.name] == setting.convert(setting.default), setting.name
    # Worked out from the host's own settings.
    secret = b"a host project's own secret, for tests only"
    assert read["RUNLEDGER_GRIP_KEY"] == hmac.new(secret, b"runledger.grip-key", hashlib.sha256).hexdigest()
    assert read["RUNLEDGER_METRICS_DIR"].startswith(str(Path(tempfile.gettempdir()) / "runledger-metrics-"))
    assert (read["RUNLEDGER_LEASE_SECONDS"], read["RUNLEDGER_MAX_RUNNING_PER_USER"]) == (30.0, None)


# --- one registry: the code's names, and the reference ------------------------------------------------

# RUNLEDGER_* names in the code that are no setting: bin/test's folder for the suite's PostgreSQL.
# bin/test's own variables: its cluster's folder, how many test processes it runs at once.
NOT_SETTINGS = {"RUNLEDGER_TEST_PGDIR", "RUNLEDGER_TEST_JOBS"}
CODE = ("runs", "config", "bin", "deploy")


def _code_files() -> list[Path]:
    found = []
    for top in CODE:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".png", ".ico"):
                found.append(path)
    return found


@pytest.mark.sqlite
@pytest.mark.timeout(30)
def test_every_runledger_name_in_the_code_is_declared_and_every_declared_setting_is_read() -> None:
    declared = {s.name: s for registry in (AppSettings, Site) for s in registry.declared()}
    texts = {path: path.read_text(errors="replace") for path in _code_files()}

    named = {name for text in texts.values() for name in re.findall(r"RUNLEDGER_[A-Z][A-Z0-9_]*[A-Z0-9]", text)}
    assert named - set(declared) - NOT_SETTINGS == set()

    # A read is an attribute of a registry's instance (`conf.LEASE_SECONDS`, `site.DB_POOL_SIZE`).
    python = "\n".join(text for path, text in texts.items() if path.suffix == ".py")
    unread = [name for name in declared if not re.search(rf"\.{name.removeprefix('RUNLEDGER_')}\b", python)]
    assert unread == []


@pytest.mark.sqlite
@pytest.mark.timeout(10)
def test_the_settings_reference_has_a_row_for_each_setting_with_its_default_meaning_and_processes() -> None:
    table = AppSettings.reference().splitlines()
    assert table[0] == "| Setting | Value | Default | What it does | Processes |"
    rows = {row.split(" | ")[0].strip("| `"): row for row in table[2:]}
    assert list(rows) == [s.name for s in AppSettings.declared()]
    assert rows["RUNLEDGER_LEASE_SECONDS"] == (
        "| `RUNLEDGER_LEASE_SECONDS` | a number of seconds above 0 | 30 | how long a worker's hold on a run lasts "
        "unless renewed; then another may take it | web, worker |"
    )
    assert rows["RUNLEDGER_MAX_STORED_BYTES_PER_USER"].split(" | ")[1:3] == [
        "a whole number ≥ 0 (0 = unlimited)",
        "1,000,000,000",
    ]
    assert rows["RUNLEDGER_AGENTS"].split(" | ")[2] == "`runs.agents.demo`"
    assert rows["RUNLEDGER_GRIP_KEY"].split(" | ")[2:] == [
        "derived from SECRET_KEY",
        "the key Pushpin signs its requests to the web processes with",
        "web, edge |",
    ]
    assert rows["RUNLEDGER_WORKER_LISTEN"].split(" | ")[2] == "1"
    assert rows["RUNLEDGER_TOOL_ENV"].split(" | ")[2] == "empty"
    assert Site.reference().count("\n") == len(Site.declared()) + 2


# --- the standalone site's environment ----------------------------------------------------------------


@pytest.mark.sqlite
@pytest.mark.timeout(10)
def test_the_site_reads_its_environment_only_through_its_registries() -> None:
    """Every variable config/ reads is declared (config/environment.py, runs/conf.py), so the
    reference generated from them names each: a raw read of os.environ would be missing there."""
    allowed = ("Site(os.environ)", "AppSettings(os.environ)", 'os.environ.setdefault("DJANGO_SETTINGS_MODULE"')
    raw = [
        f"{path.name}: {line.strip()}"
        for path in sorted((ROOT / "config").glob("*.py"))
        for line in path.read_text().splitlines()
        if re.search(r"os\.(environ|getenv)", line) and not any(use in line for use in allowed)
    ]
    assert raw == []


@pytest.mark.sqlite
@pytest.mark.timeout(10)
def test_every_site_variable_the_guides_name_is_declared_in_the_registry() -> None:
    declared = {s.name for s in Site.declared()}
    guides = [ROOT / "docs" / "how-to" / name for name in ("deploy.md", "cross-origin.md", "edge.md", "frontend.md")]
    named = {
        name for guide in guides for name in re.findall(r"\b(?:DJANGO_[A-Z_]*[A-Z]|DATABASE_URL)\b", guide.read_text())
    }
    assert named and named - {"DJANGO_SETTINGS_MODULE"} <= declared, named - declared
    assert {"DATABASE_URL", "DJANGO_SECRET_KEY", "DJANGO_SECURE_HSTS_SECONDS", "DJANGO_CORS_ALLOWED_ORIGINS"} <= named


@pytest.mark.sqlite
@pytest.mark.timeout(60)
def test_a_bad_database_url_stops_the_site_at_load_naming_the_variable_never_its_password() -> None:
    refused = _run("manage.py", "check", DATABASE_URL="mysql://runledger:hunter2-secret@db.internal/runledger")
    assert refused.returncode != 0
    last = refused.stderr.strip().splitlines()[-1]
    assert last == "django.core.exceptions.ImproperlyConfigured: DATABASE_URL must be a postgres:// or sqlite:// URL"
    assert "hunter2-secret" not in refused.stderr
