"""The distributions of the checkout, as `python -m build` makes them: what `pip install django-runledger`
(and `pip install runledger-client`) gets. tests/deploy/test_package.py checks their contents, and a host
project can install the app's wheel."""

import email.parser
import email.policy
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import ROOT, subprocess_env


def checkout_files() -> list[str]:
    """Every file of the checkout that git holds or would add (ignored ones aside): what a fresh
    clone of the tree as it stands would have, not this machine's databases or caches."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted({path for path in listed.split("\0") if path and (ROOT / path).is_file()})


def app_files() -> set[str]:
    """The app's own files: every module, migration, template and static file under runs/."""
    return {path for path in checkout_files() if path.startswith("runs/")}


@dataclass
class Built:
    wheel: Path
    sdist: Path

    def wheel_files(self) -> set[str]:
        with zipfile.ZipFile(self.wheel) as wheel:
            return {name for name in wheel.namelist() if not name.endswith("/")}

    def sdist_files(self) -> set[str]:
        """Its files, without the `<name>-<version>/` folder they sit in."""
        with tarfile.open(self.sdist) as sdist:
            return {member.name.split("/", 1)[1] for member in sdist.getmembers() if member.isfile()}

    def wheel_text(self, path: str) -> str:
        with zipfile.ZipFile(self.wheel) as wheel:
            return wheel.read(path).decode()

    def sdist_text(self, path: str) -> str:
        """The file at `path` below the sdist's `<name>-<version>/` folder."""
        with tarfile.open(self.sdist) as sdist:
            (member,) = [m for m in sdist.getmembers() if m.isfile() and m.name.split("/", 1)[1] == path]
            read = sdist.extractfile(member)
            assert read is not None
            return read.read().decode()

    def dist_info(self) -> str:
        """The wheel's `<name>-<version>.dist-info` folder."""
        (folder,) = {path.split("/")[0] for path in self.wheel_files() if path.split("/")[0].endswith(".dist-info")}
        return folder

    def metadata(self) -> EmailMessage:
        """The wheel's METADATA: the fields, and the long description as its body."""
        return _metadata(self.wheel_text(f"{self.dist_info()}/METADATA"))

    def sdist_metadata(self) -> EmailMessage:
        """The sdist's PKG-INFO, in the same form."""
        return _metadata(self.sdist_text("PKG-INFO"))


def _metadata(text: str) -> EmailMessage:
    return email.parser.Parser(policy=email.policy.compat32, _class=EmailMessage).parsestr(text)


def build(folder: Path, project: str = ".") -> Built:
    """The sdist, then the wheel built from that sdist (build's default: so a file the sdist
    lacks is missing from the wheel too), into `folder`/dist, of the distribution whose
    pyproject.toml is in `project`: the app's at the top, the client's in clients/python.

    Built from a copy of the files git has, as a fresh clone would be: setuptools writes
    django_runledger.egg-info and build/ into the tree it builds, and reads back whatever SOURCES.txt an
    earlier build left there, so the checkout would neither stay as it was nor give a clone's
    answer (and two builds at once would share those folders)."""
    source = folder / "src"
    for path in checkout_files():
        (source / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, source / path)
    out = folder / "dist"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DJANGO_"))}
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(source / project)],
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return Built(wheel=wheel, sdist=sdist)


def built_for_the_run(factory: pytest.TempPathFactory, project: str = ".") -> Built:
    """build() of `project` once for the whole test run: the first test process to ask builds it,
    under a lock, into a folder every process of the run shares (pytest-xdist's workers' temporary
    folders are siblings, in the run's own); the others wait for it and take the same files. The
    checkout does not change during a run, so each build would make the same distributions."""
    shared = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    folder = shared / ("built-" + (project.strip("./").replace("/", "-") or "app"))
    with (shared / f"{folder.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        wheels, sdists = list(folder.glob("dist/*.whl")), list(folder.glob("dist/*.tar.gz"))
        if len(wheels) == len(sdists) == 1:
            return Built(wheel=wheels[0], sdist=sdists[0])
        shutil.rmtree(folder, ignore_errors=True)  # a build that failed half-way: none of it kept
        return build(folder, project)


def core_install(
    folder: Path, *modules: str, call: str | None = None, settings: dict[str, Any] | None = None
) -> dict[str, Any]:
    """tests/support/core_install.py in a process of its own, its host's files in `folder`: the
    import attempts of the extras' modules while importing `modules` (and calling `call`)."""
    args = [sys.executable, "-m", "tests.support.core_install", *modules]
    args += [f"--set={name}={json.dumps(value)}" for name, value in (settings or {}).items()]
    if call:
        args.append(f"--call={call}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DJANGO_", "RUNLEDGER_"))}
    env["RUNLEDGER_TEST_HOST_DIR"] = str(folder)
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def in_a_bare_host(home: Path, *command: str) -> subprocess.CompletedProcess[str]:
    """`python COMMAND` in a host project of its own (on SQLite in `home`), with no RUNLEDGER_*
    setting in its settings module nor in its environment."""
    env = {k: v for k, v in subprocess_env().items() if not k.startswith("RUNLEDGER_") and k != "DATABASE_URL"}
    env.update(DJANGO_SETTINGS_MODULE="tests.support.bare_host_settings", RUNLEDGER_TEST_HOST_DIR=str(home))
    return subprocess.run([sys.executable, *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
