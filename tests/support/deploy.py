"""Production as an operator runs it (tests/deploy/): commands started with nothing of the suite's
environment, and the systemd units of deploy/ read as systemd and uvicorn read them."""

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from uvicorn.main import main as uvicorn_command

from tests.support.procs import ROOT

CHECKOUT = "/srv/runledger"  # where the units expect the project


def operator_env(**values: str) -> dict[str, str]:
    """What a process started by hand gets: PATH and `values`, nothing of the suite's environment
    (no DATABASE_URL: the embedded SQLite default)."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **values}


def run_to_end(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run `args` in the checkout to their end (a minute at most)."""
    # Bounded: a server that started after all is stopped by the timeout (and the test fails).
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def unit_settings(path: Path) -> dict[str, dict[str, list[str]]]:
    """section → key → values (systemd allows a key more than once)."""
    sections: dict[str, dict[str, list[str]]] = {}
    section: dict[str, list[str]] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = sections.setdefault(line[1:-1], {})
            continue
        key, equals, value = line.partition("=")
        assert equals, f"{path.name}: not a setting: {raw!r}"
        section.setdefault(key.strip(), []).append(value.strip())
    return sections


def exec_start(service: dict[str, list[str]]) -> tuple[str, list[str]]:
    """The program (as in this checkout's virtualenv) and arguments of a unit's one ExecStart."""
    (command,) = service["ExecStart"]
    program, *args = command.split()
    assert program.startswith(f"{CHECKOUT}/.venv/bin/"), program
    local = Path(sys.executable).parent / Path(program).name
    assert local.exists(), f"{program}: no {local.name} in the virtualenv"
    return local.name, args


def unit_uvicorn(name: str) -> dict[str, Any]:
    """The options of the uvicorn that unit `name` starts, as uvicorn's own parser reads them."""
    program, args = exec_start(unit_settings(ROOT / "deploy" / name)["Service"])
    assert program == "uvicorn", name
    return dict(uvicorn_command.make_context("uvicorn", args).params)
