"""Where a process's counters live: prometheus-client's multiprocess files, one directory per
machine and database (DESIGN §9).

Every web and worker process on a machine writes its counters and histograms to mmap files of its
own in `settings.RUNLEDGER_METRICS_DIR`; a scrape of any web process adds up every file there.
A process that exits leaves its files behind, so its counts stay in the totals: a restart never
makes a counter go down. The directory is derived from the database the settings name (see
config/settings.py), so a plain `uvicorn config.asgi:application` and a plain `manage.py
runworker` on one machine find the same one without any environment of their own.

Two things prometheus-client leaves to us:

- **Process identity.** Its files are named by pid, and pids are reused: a new process with a dead
  one's pid would reopen the dead one's files, and its live gauge (streams open) would start from
  the dead process's count. Files are named `<pid>-<start time>` instead (the kernel's start time
  of the process, from /proc), so no two processes ever share a file.
- **Dead processes' live gauges.** `mark_process_dead` needs a hook uvicorn does not have (it
  respawns workers without telling anyone), and SIGKILL runs no hook at all. So every scrape
  removes the live-gauge files of processes that no longer exist (`forget_dead`); their counters
  and histograms stay.
"""

import glob
import os
import re
from pathlib import Path

from django.conf import settings
from prometheus_client import multiprocess, values

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


def directory() -> str:
    return str(settings.RUNLEDGER_METRICS_DIR)


_installed = False


def install() -> None:
    """Put prometheus-client in multiprocess mode with our directory and file names. Runs before
    any metric is made (runs.metrics.series imports this first); metrics made earlier by other
    code keep per-process values and are not exported."""
    global _installed
    if _installed:
        return  # a second value class would open this process's files twice
    _installed = True
    path = directory()
    os.makedirs(path, mode=0o700, exist_ok=True)
    # prometheus-client reads the directory from the environment each time it opens a file.
    # Children of this process inherit it; a Runledger child still derives its own from its
    # settings (this line), so only the settings decide.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
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
