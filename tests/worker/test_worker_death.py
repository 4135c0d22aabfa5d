"""A worker that dies without unwinding (SIGKILL, the OOM killer) leaves nothing of its attempt
running (docs/design/execution.md#orphans, runs.worker.orphans): the kernel ends its tool processes'
leaders with it, a worker on the same machine kills what the leaders left in their process groups
before it requeues the run, and the run's next attempt runs its tool once.

Real worker processes on the test database, killed with SIGKILL; what is left is read from /proc.
The in-process tests drive the reaper itself against process groups the test makes, to prove it
kills nothing that is not still the recorded group.
"""

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from runs import services
from runs.events import EventType, ToolStatus
from runs.models import AttemptOutcome, Run, RunAttempt, RunEvent
from runs.selectors.clock import db_now
from runs.worker.orphans import Reaper, machine, start_ticks
from tests.factories import queued_run
from tests.support.agents import AGENTS_ENV
from tests.support.checks import assert_nothing_after_terminal
from tests.support.procs import FAST_INTERVALS, Proc, Procs, descendants, group_members, process_gone, subprocess_env
from tests.support.runs import attempt, delta_count, fresh
from tests.support.slow_http import SlowStream
from tests.support.waiting import wait_until
from tests.support.workers import wait_status

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes, pytest.mark.sqlite]

LEASE = float(FAST_INTERVALS["RUNLEDGER_LEASE_SECONDS"])
SWEEP = float(FAST_INTERVALS["RUNLEDGER_SWEEP_SECONDS"])
# Long enough for a second worker to start while the first attempt's tool runs, even on a loaded
# machine (the test checks it still runs when it kills the worker).
TOOL_MS = 6000


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, session) of `pid` from /proc, or None once it has exited."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, _ppid, pgrp, session = stat.rpartition(")")[2].split()[:4]
    return state, int(pgrp), int(session)


def left_of(worker: Proc, leaders: Iterable[int] = ()) -> list[int]:
    """The live processes of a dead worker's attempts, walking /proc: the worker itself, and every
    process in a process group or session one of its tools (`leaders`) ran in."""
    ids = set(leaders)
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            state, pgrp, session = stat
            mine = int(entry.name) == worker.pid or pgrp in ids or session in ids
            if mine and state not in ("Z", "X"):
                found.append(int(entry.name))
    return sorted(found)


def tool_started(run: Run) -> RunEvent | None:
    return RunEvent.objects.filter(run_id=run.pk, type=EventType.TOOL_STARTED).first()


def tool_finishes(run: Run) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run_id=run.pk, type=EventType.TOOL_FINISHED).order_by("seq"))


def assert_line_before(log: str, first: str, then: str) -> None:
    assert first in log and then in log, log
    assert log.index(first) < log.index(then), log


def assert_completed_after_one_lost_attempt(run: Run) -> Run:
    run = wait_status(run, "completed", "failed", "stopped", timeout=30)
    assert (run.status, run.generation, run.lost_attempts) == ("completed", 2, 1), (run.status, run.end_reason)
    first, second = attempt(run, 1), attempt(run, 2)
    assert first is not None and second is not None
    assert (first.worker, first.outcome) == ("w1", AttemptOutcome.LOST)
    assert (second.worker, second.outcome) == ("w2", AttemptOutcome.COMPLETED)
    assert_nothing_after_terminal(run)
    return run


def assert_the_tool_ran_once_in_the_next_attempt(run: Run) -> None:
    """The run completed after one lost attempt, with one call of the demo's tool, all of it in the
    next attempt: the first one's was never finished."""
    run = assert_completed_after_one_lost_attempt(run)
    (finished,) = tool_finishes(run)
    assert (finished.attempt, finished.data["status"]) == (2, ToolStatus.OK)
    assert finished.data["result"]["slept_ms"] == TOOL_MS


def killed_line(run: Run, pids: list[int], pgid: int) -> str:
    return f"killed the processes {pids} left in process group {pgid} by lost attempt 1 of run {run.pk}"


def in_its_tool(procs: Procs, owner: User, tool: str) -> tuple[Proc, Run, RunEvent]:
    """A worker, w1, executing a demo run that has started its `tool`; the `tool.started` event."""
    first = procs.worker("w1")
    run = queued_run(owner, input={"deltas": 4, "delay_ms": 1, "tool": tool, "tool_ms": TOOL_MS})
    return first, run, wait_until(lambda: tool_started(run), what=f"the {tool} tool")


def requeued_line(run: Run) -> str:
    return f"swept: requeued ['{run.pk}']"


# --- a worker killed during each kind of step, with another worker on the machine ----------------


@pytest.mark.timeout(90)
def test_a_killed_workers_process_tool_is_gone_before_its_run_is_requeued_and_runs_once_after(
    procs: Procs, alice: User
) -> None:
    first, run, started = in_its_tool(procs, alice, "process")
    leader = started.data["pid"]
    members = wait_until(lambda: len(m := group_members(leader)) == 2 and m, what="the tool and its grandchild")
    (grandchild,) = set(members) - {leader}
    # Recorded where a worker on this machine finds it.
    recorded = attempt(run)
    assert recorded is not None
    assert (recorded.machine, recorded.process_groups) == (machine(), [[leader, start_ticks(leader)]])
    second = procs.worker("w2")
    assert group_members(leader) == members, "the tool ended before the worker could be killed"

    first.kill()

    # Nothing of the first attempt is left once its lease lapsed and a sweep ran (a few sweeps'
    # slack for a loaded machine), and the grandchild — which no kernel signal reaches — was killed
    # by the other worker before it requeued the run.
    wait_until(lambda: not left_of(first, [leader]), timeout=LEASE + 6 * SWEEP, what="the old attempt gone")
    wait_until(lambda: requeued_line(run) in second.log(), what="the requeue")
    assert_line_before(second.log(), killed_line(run, [grandchild], leader), requeued_line(run))
    lost = attempt(run)
    assert lost is not None and lost.process_groups == []  # forgotten once killed

    # The next attempt starts the tool once: one group recorded, and it is all that runs of it.
    retried = wait_until(lambda: (a := attempt(run, 2)) is not None and a.process_groups and a, what="the retry")
    ((new_leader, _),) = retried.process_groups
    tools = wait_until(lambda: len(d := descendants(second.pid)) == 2 and d, what="the retried tool and its grandchild")
    assert sorted(tools) == group_members(new_leader), tools
    assert not left_of(first, [leader])

    assert_the_tool_ran_once_in_the_next_attempt(run)


@pytest.mark.timeout(90)
def test_a_killed_workers_blocking_thread_dies_with_it_and_runs_once_on_the_next_attempt(
    procs: Procs, alice: User
) -> None:
    first, run, _ = in_its_tool(procs, alice, "blocking")
    second = procs.worker("w2")
    assert not tool_finishes(run), "the tool ended before the worker could be killed"

    first.kill()

    # A thread is the worker's own: nothing of the attempt outlives the process.
    assert left_of(first) == [] and descendants(first.pid) == []
    wait_until(lambda: requeued_line(run) in second.log(), timeout=LEASE + 6 * SWEEP, what="the requeue")
    assert_the_tool_ran_once_in_the_next_attempt(run)


@pytest.mark.timeout(90)
def test_a_killed_workers_http_stream_is_disconnected_and_streamed_once_by_the_next_attempt(
    procs: Procs, alice: User
) -> None:
    with SlowStream() as server:
        first = procs.worker("w1", env=subprocess_env(**AGENTS_ENV))
        run = queued_run(alice, agent="test-http-stream", input={"url": server.url})
        wait_until(lambda: delta_count(run) == 1, what="the stream's first line")
        # The first attempt's stream never ends by itself; the next one's ends after 20 lines.
        server.lines_per_connection = 20
        procs.worker("w2", env=subprocess_env(**AGENTS_ENV))
        assert not server.disconnected.is_set() and server.connections == 1

        first.kill()

        # The kernel closed the dead worker's socket: the model server saw the disconnect.
        wait_until(server.disconnected.is_set, timeout=LEASE, what="the server seeing the disconnect")
        assert left_of(first) == []
        run = assert_completed_after_one_lost_attempt(run)
        # The next attempt streamed once, to the end.
        assert server.connections == 2
        assert run.output == {"lines": 20}
        deltas = RunEvent.objects.filter(run_id=run.pk, type=EventType.OUTPUT_DELTA).order_by("seq")
        assert [e.attempt for e in deltas] == [1, 2]


# --- with no other worker running ------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_the_kernel_ends_a_killed_workers_tool_at_once_and_the_next_worker_here_kills_what_it_left(
    procs: Procs, alice: User
) -> None:
    first = procs.worker("w1")
    run = queued_run(alice, input={"deltas": 4, "delay_ms": 1, "tool": "process", "tool_ms": 60_000})
    leader = wait_until(lambda: tool_started(run), what="the process tool").data["pid"]
    members = wait_until(lambda: len(m := group_members(leader)) == 2 and m, what="the tool and its grandchild")
    (grandchild,) = set(members) - {leader}

    first.kill()

    # No worker runs to sweep, and the lease has not even lapsed: only the kernel can have done it.
    wait_until(lambda: process_gone(leader), timeout=LEASE / 2, what="the leader's death")
    lost = attempt(run)
    assert lost is not None and db_now() < lost.lease_expires_at
    # What the leader started gets no signal from the kernel: it runs on, until a worker runs here.
    assert not process_gone(grandchild)
    wait_until(lambda: db_now() > lost.lease_expires_at, timeout=LEASE, what="the lease's lapse")
    assert not process_gone(grandchild)

    # It kills them as it starts, before it claims anything (the run among them).
    second = procs.worker("w2")
    assert killed_line(run, [grandchild], leader) in second.log()
    wait_until(lambda: not left_of(first, [leader]), timeout=5, what="the grandchild's death")
    wait_until(lambda: requeued_line(run) in second.log(), what="the requeue")
    assert_line_before(second.log(), killed_line(run, [grandchild], leader), requeued_line(run))
    wait_until(lambda: (a := attempt(run, 2)) is not None and a.process_groups, what="the retry's tool")
    services.run_cancel(run_id=run.pk, actor=alice)
    wait_until(lambda: (a := attempt(run, 2)) is not None and a.released_at, what="the retry's release")
    assert fresh(run).lost_attempts == 1


# --- the reaper itself: what it kills, and what it leaves alone ------------------------------------

# Leads a process group that outlives it: it starts a member, prints the member's pid, and exits
# once its stdin closes.
LEAVES_A_MEMBER = """
import subprocess, sys
member = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(member.pid, flush=True)
sys.stdin.read()
"""


@pytest.fixture
def groups() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Process groups the test starts (each its own session); whatever is left is killed after."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for popen in started:
        for pid in group_members(popen.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        popen.kill()
        popen.wait(timeout=10)


def sleeper(groups: list[subprocess.Popen[bytes]]) -> int:
    popen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    groups.append(popen)
    wait_until(lambda: start_ticks(popen.pid) is not None, what="the process")
    return popen.pid


def leaderless_group(groups: list[subprocess.Popen[bytes]]) -> tuple[int, int, int]:
    """A process group whose leader exited and was reaped, leaving one member: (group id, the
    leader's start ticks, the member's pid)."""
    popen = subprocess.Popen(
        [sys.executable, "-c", LEAVES_A_MEMBER], start_new_session=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    groups.append(popen)
    assert popen.stdout is not None and popen.stdin is not None
    member = int(popen.stdout.readline())
    leader_ticks = start_ticks(popen.pid)
    assert leader_ticks is not None
    popen.stdin.close()
    popen.wait(timeout=10)
    return popen.pid, leader_ticks, member


def claimed_attempt(owner: User, *, where: str, groups: list[list[int]]) -> RunAttempt:
    queued_run(owner)
    claimed = services.run_claim(worker="elsewhere", machine=where)
    assert claimed is not None
    run, found = claimed
    for group in groups:
        services.run_attempt_group_record(run_id=run.pk, generation=run.generation, group=group)
    return found


def lose(found: RunAttempt) -> None:
    """As a sweeper (on any machine) does once the attempt's lease lapsed."""
    later = RunAttempt.objects.get(pk=found.pk).lease_expires_at + timedelta(seconds=1)
    assert services.run_lease_expire(run_id=found.run_id, generation=found.generation, as_of=later) is not None


def recorded(found: RunAttempt) -> list[list[int]]:
    return list(RunAttempt.objects.get(pk=found.pk).process_groups)


@pytest.mark.timeout(60)
def test_a_lost_attempts_group_is_killed_only_while_it_is_still_the_recorded_group(
    alice: User, groups: list[subprocess.Popen[bytes]]
) -> None:
    here = machine()
    ours = sleeper(groups)
    reused = sleeper(groups)
    pgid, leader_ticks, member = leaderless_group(groups)
    early_pgid, _, early_member = leaderless_group(groups)
    ours_ticks, reused_ticks = start_ticks(ours), start_ticks(reused)
    assert ours_ticks is not None and reused_ticks is not None
    member_ticks = start_ticks(early_member)
    assert member_ticks is not None
    lost = claimed_attempt(
        alice,
        where=here,
        groups=[
            [ours, ours_ticks],  # its leader still running: killed
            [pgid, leader_ticks],  # its leader gone, its member started after it: killed
            # The recorded leader's pid belongs to a process started before it: another process.
            [reused, reused_ticks - 1],
            # Its leader gone, and its member started before the recorded leader: not that group.
            [early_pgid, member_ticks + 1],
        ],
    )
    lose(lost)

    Reaper(here).sweep()

    assert process_gone(ours) and process_gone(member)
    assert not process_gone(reused) and not process_gone(early_member)
    assert recorded(lost) == []  # forgotten, killed or not: none of them is left to look for


@pytest.mark.timeout(60)
def test_only_lost_attempts_of_this_machine_are_reaped_even_when_another_machine_requeued_them(
    alice: User, groups: list[subprocess.Popen[bytes]]
) -> None:
    here = machine()
    running, later, elsewhere = sleeper(groups), sleeper(groups), sleeper(groups)
    live = claimed_attempt(alice, where=here, groups=[[running, start_ticks(running) or 0]])
    watched = claimed_attempt(alice, where=here, groups=[[later, start_ticks(later) or 0]])
    other = claimed_attempt(alice, where="another machine", groups=[[elsewhere, start_ticks(elsewhere) or 0]])
    lose(other)
    reaper = Reaper(here)

    reaper.sweep()

    # The attempts' leases hold: their tools belong to a live worker. Another machine's are not ours.
    assert not process_gone(running) and not process_gone(later) and not process_gone(elsewhere)
    assert recorded(live) and recorded(watched) and recorded(other)

    # A sweeper on another machine marks one of them lost (released): the next sweep here, which
    # no longer reads every lost attempt, still finds it.
    lose(watched)
    reaper.sweep()

    assert process_gone(later) and recorded(watched) == []
    assert not process_gone(running) and not process_gone(elsewhere) and recorded(live) and recorded(other)
