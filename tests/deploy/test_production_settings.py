"""Production settings (docs/design/operations.md#deploy): a start that is unsafe is refused, the
documented variables pass check --deploy, the embedded default keeps a local key of its own.

These start processes with nothing of the suite's environment: only PATH and the variables an operator
sets, on the embedded default database (no DATABASE_URL)."""

import re
import secrets
import stat
import sys
from pathlib import Path

import pytest

from tests.support.deploy import operator_env, run_to_end
from tests.support.procs import ROOT, Procs, free_port

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

PUBLIC_HOST = "runledger.example.com"


@pytest.mark.sqlite
def test_a_public_host_without_a_secret_key_stops_every_command_and_the_server(tmp_path: Path) -> None:
    key_file = tmp_path / "local-secret-key"
    env = operator_env(DJANGO_ALLOWED_HOSTS=f"localhost,{PUBLIC_HOST}", RUNLEDGER_LOCAL_SECRET_FILE=str(key_file))
    for args in (
        [sys.executable, "manage.py", "check"],
        [sys.executable, "manage.py", "runworker"],
        [sys.executable, "-m", "uvicorn", "config.asgi:application", "--port", str(free_port())],
    ):
        done = run_to_end(args, env)
        assert done.returncode != 0, (args, done.stdout, done.stderr)
        assert f"DJANGO_SECRET_KEY must be set: DJANGO_ALLOWED_HOSTS allows {PUBLIC_HOST}" in done.stderr, args
    assert not key_file.exists()  # a public deployment never falls back to a local key


@pytest.mark.sqlite
def test_check_deploy_passes_with_the_four_documented_variables() -> None:
    documented = {
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DJANGO_ALLOWED_HOSTS": PUBLIC_HOST,
        "DJANGO_CSRF_TRUSTED_ORIGINS": f"https://{PUBLIC_HOST}",
        "DJANGO_SECURE_HTTPS": "1",
    }
    check = [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"]
    done = run_to_end(check, operator_env(**documented))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout

    # The same check fails without DJANGO_SECURE_HTTPS: it does look at the security settings.
    documented.pop("DJANGO_SECURE_HTTPS")
    done = run_to_end(check, operator_env(**documented))
    assert done.returncode != 0
    assert {"security.W004", "security.W008", "security.W012", "security.W016"} <= set(
        re.findall(r"security\.W\d+", done.stdout + done.stderr)
    )


@pytest.mark.sqlite
def test_the_embedded_default_keeps_a_random_local_key_of_its_own(procs: Procs, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    print_key = [sys.executable, "-c", "from django.conf import settings; print(settings.SECRET_KEY)"]

    def keys_of(key_file: Path, processes: int) -> set[str]:
        env = operator_env(DJANGO_SETTINGS_MODULE="config.settings", RUNLEDGER_LOCAL_SECRET_FILE=str(key_file))
        started = [procs.start("print-key", print_key, env) for _ in range(processes)]
        for proc in started:
            proc.wait_exit(timeout=60)
        return {proc.log().strip() for proc in started}

    # Processes starting at once on no key yet: one key is made, and every process reads it whole.
    first = keys_of(keys / "secret-key", 4)
    assert len(first) == 1
    (key,) = first
    assert key == (keys / "secret-key").read_text().strip()
    assert len(key) >= 50
    assert stat.S_IMODE((keys / "secret-key").stat().st_mode) == 0o600
    # Kept: a later process gets the same key.
    assert keys_of(keys / "secret-key", 1) == {key}
    # Random, not a constant of the code: another file, another key.
    (other,) = keys_of(keys / "another-key", 1)
    assert other != key
    assert key not in (ROOT / "config" / "settings.py").read_text()
    assert sorted(path.name for path in keys.iterdir()) == ["another-key", "secret-key"]  # nothing left beside
