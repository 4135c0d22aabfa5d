"""Where a process's counters live: prometheus-client's multiprocess files, one private directory
per machine and database, named by process identity (docs/design/operations.md#metrics-store).

`install` puts prometheus-client in multiprocess mode at a process's start or first count, never
at import.
"""

import glob
import logging
import os
import re
import tempfile
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured
from prometheus_client import mmap_dict, multiprocess, values

from runs.conf import conf
from runs.private_paths import private_directory

log = logging.getLogger(__name__)

_IDENTITY = re.compile(r"_(\d+)-(\d+)\.db$")


def _start_time(pid: int) -> int:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat), which
    tells a reused pid from its earlier owner; 0 where /proc is not there (then pid alone), -1
    for a process that has exited (a zombie waiting for its parent included)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return -1
    except OSError:
        return 0
    # The command name, in parentheses, may hold anything: the fields follow its last ')'.
    fields = stat.rpartition(")")[2].split()
    return -1 if fields[0] in ("Z", "X") else int(fields[19])


_identity: tuple[int, str] = (0, "")


def process_identity() -> str:
    """`<pid>-<start time>`, recomputed only after a fork: prometheus-client calls this on every
    increment to notice forks, so it must cost no more than `os.getpid()`."""
    global _identity
    pid = os.getpid()
    if _identity[0] != pid:
        _identity = (pid, f"{pid}-{_start_time(pid)}")
    return _identity[1]


def alive(pid: int, start_time: int) -> bool:
    if start_time:
        return _start_time(pid) == start_time  # else gone, or a newer process holds the pid
    try:
        os.kill(pid, 0)  # no /proc: the pid alone says
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# The directory this process counts in, once `install` has chosen it.
_directory: str | None = None


def directory() -> str:
    return _directory if _directory is not None else conf.METRICS_DIR


def _choose(path: str) -> str:
    """The directory to count in: `path` once it is private (docs/design/operations.md#metrics-store)."""
    problem = private_directory(path)
    if problem is None:
        return path
    if os.path.dirname(os.path.abspath(path)) != os.path.abspath(tempfile.gettempdir()):
        raise ImproperlyConfigured(f"RUNLEDGER_METRICS_DIR {path} is not this user's private directory: {problem}")
    own = tempfile.mkdtemp(prefix="runledger-metrics-private-")
    log.warning(
        "the metrics directory %s is not this user's private directory (%s): this process counts in %s, so "
        "GET /metrics/ does not add up its counts with the other processes'; remove %s, or set "
        "RUNLEDGER_METRICS_DIR to a directory of this user's",
        path,
        problem,
        own,
        path,
    )
    return own


class _PrivateFile(mmap_dict.MmapedDict):
    """prometheus-client's file of one process, made readable and writable by this user only, and
    never opened through a link (its own `open` would follow one, and make the file 0644)."""

    def __init__(self, filename: str, read_mode: bool = False) -> None:
        if not read_mode:
            os.close(os.open(filename, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        super().__init__(filename, read_mode)


_installed = False


def install() -> None:
    """Put prometheus-client in multiprocess mode with our directory and file names, before any
    metric of ours is made (`runs.metrics.series.made`); metrics made earlier by other code keep
    per-process values and are not exported."""
    global _installed, _directory
    if _installed:
        return  # a second value class would open this process's files twice
    path = _directory = _choose(conf.METRICS_DIR)
    _installed = True
    # prometheus-client reads the directory from the environment each time it opens a file.
    # Children of this process inherit it; a Runledger child still derives its own from its
    # settings (this line), so only the settings decide.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    # The value class opens its files through this module attribute when a metric is made.
    values.MmapedDict = _PrivateFile  # type: ignore[misc]
    values.ValueClass = values.MultiProcessValue(process_identifier=process_identity)


def forget_dead() -> int:
    """Remove the live-gauge files of processes that have exited (however they exited); returns
    how many processes were forgotten."""
    dead = set()
    for path in glob.glob(os.path.join(directory(), "gauge_live*_*.db")):
        found = _IDENTITY.search(path)
        if found and not alive(int(found[1]), int(found[2])):
            dead.add(f"{found[1]}-{found[2]}")
    for identity in dead:
        multiprocess.mark_process_dead(identity, directory())
    return len(dead)
