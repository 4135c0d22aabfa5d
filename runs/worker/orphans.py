"""Tool processes whose worker died: the operating system's side (docs/design/execution.md#orphans).

The kernel ends each group's leader with its worker (`dies_with`); a worker on the same machine
kills what is left of lost attempts' groups (`Reaper`), never a process whose id was reused
(docs/design/execution.md#orphan-groups).
"""

import contextlib
import ctypes
import logging
import os
import select
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache

from runs import services

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_SIGKILL = int(signal.SIGKILL)
# Resolved once, here: in the child between fork and exec nothing is looked up or loaded.
_prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
if _prctl is not None:
    _prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    _prctl.restype = ctypes.c_int
# Rounds of kill-and-look-again for a group whose members fork while they are being killed.
_KILL_ROUNDS = 10
# How long to wait for a killed process to be dead (SIGKILL is not instant in uninterruptible sleep).
_DEATH_SECONDS = 1.0


def dies_with(worker_pid: int, then: Callable[[], object] | None = None) -> Callable[[], object] | None:
    """A `preexec_fn` that makes the child get SIGKILL when the thread that forked it ends (and
    with it the worker, `worker_pid`), then runs `then` (the agent's own `preexec_fn`). Where there
    is no `prctl` (not Linux) just `then`."""
    if _prctl is None:
        return then
    prctl, getppid, exit_ = _prctl, os.getppid, os._exit

    def preexec() -> None:
        if prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0) != 0:
            # A tool that would outlive its worker does not start: the worker's Popen raises.
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        # The worker died between the fork and the prctl: nobody is left to send the signal.
        if getppid() != worker_pid:
            exit_(1)
        if then is not None:
            then()

    return preexec


@cache
def machine() -> str:
    """Where this process runs, as `RunAttempt.machine` records it: the boot, and the PID namespace
    (whose process ids and /proc the worker sees). Empty without /proc (not Linux): nothing is
    recorded or looked for then."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            boot_id = boot.read().strip()
        return f"{boot_id}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


@dataclass(frozen=True)
class _Stat:
    state: str
    pgrp: int
    start_ticks: int


def _stat(pid: int) -> _Stat | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name, in parentheses, may hold anything: fields 3 on follow its last ')'.
    fields = stat.rpartition(")")[2].split()
    return _Stat(state=fields[0], pgrp=int(fields[2]), start_ticks=int(fields[19]))


def start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (field 22 of /proc/<pid>/stat); None once gone."""
    found = _stat(pid)
    return None if found is None else found.start_ticks


def _live_members(pgid: int, since_ticks: int) -> dict[int, int]:
    """The live processes (zombies left out) of group `pgid` started at `since_ticks` or later, with
    their start times."""
    found = {}
    for entry in os.listdir("/proc"):
        stat = _stat(int(entry)) if entry.isdigit() else None
        if stat is not None and stat.pgrp == pgid and stat.state not in ("Z", "X") and stat.start_ticks >= since_ticks:
            found[int(entry)] = stat.start_ticks
    return found


def _kill(pid: int, pgid: int, ticks: int) -> bool:
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError:  # no pidfds (a kernel before 5.3): the check below, then the pid
        pidfd = -1
    try:
        # Checked again now that the pidfd holds the process: if the id was reused since the walk,
        # /proc shows the newcomer, whose start time differs.
        now = _stat(pid)
        if now is None or (now.pgrp, now.start_ticks) != (pgid, ticks):
            return False
        with contextlib.suppress(ProcessLookupError):
            if pidfd >= 0:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                # Readable once the process has exited: dead before the sweep requeues its run.
                exited = select.poll()
                exited.register(pidfd, select.POLLIN)
                exited.poll(_DEATH_SECONDS * 1000)
            else:
                os.kill(pid, signal.SIGKILL)
        return True
    finally:
        if pidfd >= 0:
            os.close(pidfd)


def kill_group(pgid: int, leader_ticks: int) -> list[int]:
    """SIGKILL what is left of the process group a tool ran in, if it is still that group; the
    pids killed."""
    killed: list[int] = []
    signalled: set[tuple[int, int]] = set()
    for _ in range(_KILL_ROUNDS):
        leader = _stat(pgid)
        if leader is not None and leader.start_ticks != leader_ticks:
            # The leader's id belongs to another process now: so does the group id.
            return killed
        # A process killed forks no more, so only members not seen yet need another round.
        members = {m for m in _live_members(pgid, leader_ticks).items() if m not in signalled}
        if not members:
            return killed
        for pid, ticks in members:
            signalled.add((pid, ticks))
            try:
                if _kill(pid, pgid, ticks):
                    killed.append(pid)
            except PermissionError:
                log.warning("process %d of group %d belongs to another user; not killed", pid, pgid)
                return killed
    log.warning("process group %d still had new members after %d rounds of SIGKILL", pgid, _KILL_ROUNDS)
    return killed


@dataclass
class Reaper:
    """One worker's search for tool processes that outlived theirs (on its sweep lane).

    The sweep's query is cheap: the attempts of this machine not yet released (the unreleased
    index), and the ones such a query returned last time (by primary key) — so an attempt another
    machine's sweeper marked lost since is still found. Only the first search also reads every
    attempt of this machine marked lost (those of a worker that died before this one started),
    once per worker start; each is forgotten once handled."""

    machine: str
    _watched: set[int] = field(default_factory=set)
    _scanned_lost: bool = False

    def sweep(self, *, as_of: datetime | None = None) -> int:
        """Kill what is left of the lost attempts' process groups, judging leases at `as_of` (the
        database's clock when None); how many processes were killed."""
        found = services.attempt_groups_orphaned(
            machine=self.machine, watched=self._watched, all_lost=not self._scanned_lost, as_of=as_of
        )
        self._scanned_lost = True
        # Kept until forgotten, in case forgetting fails.
        self._watched = set(found.unreleased) | {orphan.attempt_id for orphan in found.orphans}
        total = 0
        for orphan in found.orphans:
            for pgid, ticks in orphan.groups:
                killed = kill_group(pgid, ticks)
                total += len(killed)
                if killed:
                    log.warning(
                        "killed the processes %s left in process group %d by lost attempt %d of run %s",
                        killed,
                        pgid,
                        orphan.generation,
                        orphan.run_id,
                        extra={
                            "event": "orphans_killed",
                            "run_id": str(orphan.run_id),
                            "generation": orphan.generation,
                        },
                    )
            services.run_attempt_groups_forget(attempt_id=orphan.attempt_id, groups=orphan.groups)
        return total
