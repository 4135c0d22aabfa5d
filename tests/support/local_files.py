"""A fresh Python process on settings of its own, for what a process does once at its start: the
files it creates, the directories and keys it accepts. Under a umask of 022 — the usual one, which
would leave new files readable by every user — so the modes seen are the ones the app chose."""

import os
import stat
import subprocess
import sys
from pathlib import Path

from tests.support.procs import ROOT

SETUP = "import django; django.setup()\n"


def run_python(code: str, *, setup: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
    """`code` after `django.setup()` (unless not `setup`), with PATH and `env` only (no
    DATABASE_URL unless given)."""
    return subprocess.run(
        [sys.executable, "-c", (SETUP if setup else "") + code],
        cwd=ROOT,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "DJANGO_SETTINGS_MODULE": "config.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
        umask=0o022,
    )


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)
