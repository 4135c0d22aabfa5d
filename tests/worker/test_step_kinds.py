"""Every kind of step stops when its run is cancelled (docs/design/execution.md#step-kinds): a child
process and its whole process group, blocking code in a thread, an HTTP stream — whether the agent
honours the cancellation or ignores it and is abandoned.

Each test runs a real worker process on the test database and cancels through the service, as
the API does; what the attempt stopped is watched from outside the worker: /proc, the stored
events, the worker's log, the server end of the HTTP stream.
"""

import signal
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from runs import services
from runs.events import EventType
from runs.models import AttemptOutcome, Run, RunAttempt, RunEvent
from runs.worker.steps import TOOL_ENV
from tests.factories import queued_run
from tests.support.agents import AGENTS_ENV
from tests.support.checks import assert_nothing_after_terminal, assert_tool_call_sealed
from tests.support.procs import FAST_INTERVALS, Procs, group_members, process_gone, subprocess_env, wait_log_line
from tests.support.runs import delta_count, fresh, released
from tests.support.slow_http import SlowStream
from tests.support.waiting import wait_until
from tests.support.workers import prove_worker_moved_on, wait_status

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.processes,
    pytest.mark.timeout(90),
    pytest.mark.sqlite,
]

GRACE = timedelta(seconds=float(FAST_INTERVALS["RUNLEDGER_CANCEL_GRACE_SECONDS"]))
# Cancel → released, at most: the worker hears of the cancel (a notification, or the 0.5 s poll),
# then unwinds within two graces.
PROMPTLY = timedelta(seconds=2)


def tool_started(run: Run) -> RunEvent | None:
    return RunEvent.objects.filter(run_id=run.pk, type=EventType.TOOL_STARTED).first()


def cancel_and_wait_for_release(run: Run, owner: User) -> tuple[RunAttempt, timedelta]:
    """Cancel `run`; its released attempt, and how long after the cancel committed it was released."""
    services.run_cancel(run_id=run.pk, actor=owner)
    gone = wait_until(lambda: released(run), what="the attempt's release")
    ended_at = fresh(run).ended_at
    assert gone.outcome == AttemptOutcome.CANCELLED
    assert gone.released_at is not None and ended_at is not None
    return gone, gone.released_at - ended_at


# --- child processes -------------------------------------------------------------------------------


def test_cancelling_a_child_process_ends_its_whole_process_group(procs: Procs, alice: User) -> None:
    procs.worker("w1")
    run = queued_run(alice, input={"deltas": 4, "delay_ms": 1, "tool": "process", "tool_ms": 60_000})
    started = wait_until(lambda: tool_started(run), what="the process tool")
    pid = started.data["pid"]
    # The child and the grandchild it starts in its process group.
    group = wait_until(lambda: len(members := group_members(pid)) == 2 and members, what="the process and its child")
    assert pid in group

    _, took = cancel_and_wait_for_release(run, alice)

    # Both honour SIGTERM; by the time the release is visible, the whole group is gone.
    assert group_members(pid) == [] and all(process_gone(p) for p in group), group
    assert took < PROMPTLY, took
    # The call's only finish is the platform's seal: a late result would be a second, `ok`, one.
    assert_tool_call_sealed(run)


def test_a_worker_that_exits_at_once_takes_its_child_processes_with_it(procs: Procs, alice: User) -> None:
    worker = procs.worker("w1")
    run = queued_run(alice, input={"deltas": 4, "delay_ms": 1, "tool": "process", "tool_ms": 60_000})
    pid = wait_until(lambda: tool_started(run), what="the process tool").data["pid"]
    group = wait_until(lambda: len(members := group_members(pid)) == 2 and members, what="the process and its child")

    # The second signal exits without waiting for any run (they come back by lease expiry).
    worker.signal(signal.SIGTERM)
    wait_until(lambda: "finishing at safe boundaries" in worker.log(), what="the first signal heard")
    worker.signal(signal.SIGTERM)
    assert worker.popen.wait(timeout=30) == 1

    wait_until(lambda: all(process_gone(p) for p in group), what="the whole group gone", timeout=5)
    assert group_members(pid) == []


@pytest.mark.parametrize("agent_ignores_cancel", [False, True], ids=["agent-honours-cancel", "agent-ignores-cancel"])
def test_a_child_process_deaf_to_sigterm_is_killed_after_the_grace_and_reaped_before_the_release(
    procs: Procs, alice: User, agent_ignores_cancel: bool
) -> None:
    worker = procs.worker("w1", env=subprocess_env(**AGENTS_ENV))
    run = queued_run(alice, agent="test-process", input={"ignore_cancel": agent_ignores_cancel})
    started = wait_until(lambda: tool_started(run), what="the deaf process")
    pid, grandchild = started.data["pid"], started.data["grandchild_pid"]
    assert group_members(pid) == sorted([pid, grandchild])

    _, took = cancel_and_wait_for_release(run, alice)

    # Only the SIGKILL at the end of the grace could end them, and the release waited for it.
    assert group_members(pid) == [] and process_gone(pid) and process_gone(grandchild)
    assert GRACE <= took < PROMPTLY, took
    log = worker.log()
    assert f"killing the process groups still running after the grace: [{pid}]" in log, log
    assert ("the agent ignored cancellation; abandoning it" in log) == agent_ignores_cancel, log
    # The call's only finish is the platform's seal: a late result would be a second, `ok`, one.
    assert_tool_call_sealed(run)


# --- blocking code in a thread --------------------------------------------------------------------


def test_blocking_code_in_a_thread_is_abandoned_and_its_late_result_never_stored(procs: Procs, alice: User) -> None:
    worker = procs.worker("w1")
    run = queued_run(alice, input={"deltas": 4, "delay_ms": 1, "tool": "blocking", "tool_ms": 2500})
    wait_until(lambda: tool_started(run), what="the blocking tool")

    _, took = cancel_and_wait_for_release(run, alice)

    # The attempt waited for the thread until the grace was over, not for the 2.5 s it sleeps.
    assert GRACE <= took < PROMPTLY, took
    last_seq = fresh(run).last_seq
    prove_worker_moved_on(alice, "w1")  # while the abandoned thread still sleeps
    late = f"an abandoned thread of <attempt 1 of run {run.pk}> finished late; its result was discarded"
    wait_log_line(worker, late, timeout=15)
    assert fresh(run).last_seq == last_seq  # nothing of it was stored: no result, no delta after it
    # The call's only finish is the platform's seal: a late result would be a second, `ok`, one.
    assert_tool_call_sealed(run)


def test_an_abandoned_thread_does_not_hold_up_the_workers_exit(procs: Procs, alice: User) -> None:
    worker = procs.worker("w1")
    run = queued_run(alice, input={"deltas": 4, "delay_ms": 1, "tool": "blocking", "tool_ms": 60_000})
    wait_until(lambda: tool_started(run), what="the blocking tool")
    cancel_and_wait_for_release(run, alice)

    began = time.monotonic()
    # A thread of the default executor would be joined at interpreter exit, a minute from now;
    # `stop` would then SIGKILL the worker after 10 s and report -9.
    assert worker.stop(timeout=10) == 0
    assert time.monotonic() - began < 5


# --- HTTP streams ---------------------------------------------------------------------------------


@pytest.mark.parametrize("agent_ignores_cancel", [False, True], ids=["agent-honours-cancel", "agent-ignores-cancel"])
def test_cancelling_an_http_stream_closes_it_and_the_server_sees_the_disconnect(
    procs: Procs, alice: User, agent_ignores_cancel: bool
) -> None:
    with SlowStream() as server:
        worker = procs.worker("w1", env=subprocess_env(**AGENTS_ENV))
        run = queued_run(
            alice, agent="test-http-stream", input={"url": server.url, "ignore_cancel": agent_ignores_cancel}
        )
        wait_until(lambda: delta_count(run) == 1, what="the stream's first line")
        wait_until(lambda: server.lines_sent >= 3, what="the stream going on")
        assert not server.disconnected.is_set()

        gone, took = cancel_and_wait_for_release(run, alice)

        wait_until(server.disconnected.is_set, what="the server seeing the disconnect")
        assert server.disconnected_at is not None and gone.released_at is not None
        ended_at = fresh(run).ended_at
        assert ended_at is not None
        disconnected = timedelta(seconds=server.disconnected_at - ended_at.timestamp())
        # An agent that ignores the cancellation keeps the stream open until the attempt closes
        # it, at the end of the grace; the cancelled read of one that honours it closes it at once.
        assert (GRACE if agent_ignores_cancel else timedelta(0)) <= disconnected < PROMPTLY, disconnected
        assert took < PROMPTLY, took
        assert ("the agent ignored cancellation; abandoning it" in worker.log()) == agent_ignores_cancel
        assert delta_count(run) == 1
        assert_nothing_after_terminal(run)


# --- what a tool process gets of the worker's environment -------------------------------------------


def test_a_tool_process_gets_a_few_of_the_workers_variables_and_the_ones_named_for_tools(
    procs: Procs, alice: User, tmp_path: Path
) -> None:
    secrets = {
        "DJANGO_SECRET_KEY": "k" * 50,
        "RUNLEDGER_OPENAI_API_KEY": "sk-not-for-tools",
        "RUNLEDGER_GRIP_KEY": "g" * 40,
        "RUNLEDGER_METRICS_TOKEN": "scrape",
    }
    env = subprocess_env(
        **AGENTS_ENV,
        **secrets,
        HOME=str(tmp_path),
        LANG="C.UTF-8",
        TZ="UTC",
        RUNLEDGER_TOOL_ENV="RUNLEDGER_TEST_FOR_TOOLS",
        RUNLEDGER_TEST_FOR_TOOLS="named",
    )
    procs.worker("w1", env=env)
    plain = queued_run(alice, agent="test-tool-env", input={})
    own = queued_run(alice, agent="test-tool-env", input={"env": {"PATH": "/bin", "AGENT_OWN": "1"}})

    got = wait_status(plain, "completed", timeout=30).output["env"]
    expected = {name: env[name] for name in TOOL_ENV if name in env} | {"RUNLEDGER_TEST_FOR_TOOLS": "named"}
    # Python itself may set LC_CTYPE in a child it coerces to UTF-8 (PEP 538): one of the names anyway.
    assert {k: v for k, v in got.items() if k != "LC_CTYPE"} == {k: v for k, v in expected.items() if k != "LC_CTYPE"}
    assert {"PATH", "HOME", "LANG", "TZ"} <= set(got)
    for name in (*secrets, "DATABASE_URL", "DJANGO_SETTINGS_MODULE", "RUNLEDGER_AGENTS"):
        assert name not in got, name
    # An agent's own env= adds to them and wins.
    got = wait_status(own, "completed", timeout=30).output["env"]
    assert (got["PATH"], got["AGENT_OWN"], got["HOME"], got["LANG"]) == ("/bin", "1", env["HOME"], "C.UTF-8")
    assert not set(secrets) & set(got)
