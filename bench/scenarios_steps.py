"""Cancel latency per kind of step: how long after a cancel commits the worker has
stopped a run that is inside an await, a child process, blocking code in a thread or an HTTP
stream (runs/worker/steps.py). Import only after `django.setup()`, in a setup whose processes
load the tests' agents (`tests.support.agents.AGENTS_ENV`).

Each sample is one run of one kind, created, waited for until its step is under way (its
`tool.started` stored; for the HTTP stream, the stream's first line), cancelled through the
service (`services.run_cancel`, as the API does), then waited for until its attempt is released —
one at a time, so no two samples overlap. The figure is the attempt's `released_at` (taken by the
worker once it stopped executing, just before it writes it) minus the moment `run_cancel` returned:
wall-clock on this one machine, as in `scenarios.cancel`.
"""

import time
from collections import Counter
from contextlib import nullcontext
from datetime import UTC, datetime
from typing import Any

from django.db import connection

from bench import scenarios as sc
from bench.lib import CpuMeter, Ctx, summary
from runs import services
from runs.conf import conf
from runs.events import EventType, ToolStatus
from runs.models import Run, RunAttempt, RunEvent
from tests.factories import assert_log_is_sound
from tests.support.procs import group_members
from tests.support.runs import released
from tests.support.slow_http import SlowStream
from tests.support.waiting import wait_until

AWAIT, PROCESS, THREAD, HTTP = "await", "process", "thread abandon", "HTTP stream"
KINDS = (AWAIT, PROCESS, THREAD, HTTP)
# The demo agent's tool for each kind; the HTTP stream is the tests' agent reading a SlowStream.
DEMO_TOOL = {AWAIT: "slow", PROCESS: "process", THREAD: "blocking"}
HTTP_AGENT = "test-http-stream"

# The last two events of a cancelled run's log (type, tool status): the tool call sealed as
# `interrupted` at the finish boundary, then the terminal event. The HTTP-stream agent makes no
# tool call: the stream's one stored line, then the terminal event.
SEALED_TAIL = [(EventType.TOOL_FINISHED, ToolStatus.INTERRUPTED), (EventType.RUN_CANCELLED, None)]
EXPECTED_TAIL = {AWAIT: SEALED_TAIL, PROCESS: SEALED_TAIL, THREAD: SEALED_TAIL}
EXPECTED_TAIL[HTTP] = [(EventType.OUTPUT_DELTA, None), (EventType.RUN_CANCELLED, None)]


# Committed → released p99, one at a time: a step that can be stopped stops within
# this; a thread cannot be, and is abandoned at the unwind deadline, a grace after the trip.
TARGET_P99_MS = 25


SAMPLE_KEYS = ("run_id", "committed_at", "released_after_commit_ms")


def grace_seconds() -> float:
    """The workers' RUNLEDGER_CANCEL_GRACE_SECONDS: they read the environment this process does."""
    return conf.CANCEL_GRACE_SECONDS


def waits_ms() -> dict[str, float]:
    """What each kind waits for by design after the trip: a thread, the whole grace."""
    return {kind: grace_seconds() * 1000 if kind == THREAD else 0 for kind in KINDS}


def targets_p99_ms() -> dict[str, float]:
    return {kind: TARGET_P99_MS + wait for kind, wait in waits_ms().items()}


def _under_way(run_id: Any, kind: str) -> RunEvent | None:
    started = EventType.OUTPUT_DELTA if kind == HTTP else EventType.TOOL_STARTED
    return RunEvent.objects.filter(run_id=run_id, type=started).first()


def _cancel_one(ctx: Ctx, kind: str, tool_ms: int) -> dict[str, Any]:
    with SlowStream() if kind == HTTP else nullcontext() as server:
        created = time.time()
        if server is not None:
            run = services.run_create(owner=ctx.user, agent=HTTP_AGENT, input={"url": server.url})
        else:
            tool = {"tool": DEMO_TOOL[kind], "tool_ms": tool_ms}
            # One delta: the tool is called at once (halfway), the run's first step.
            run = services.run_create(owner=ctx.user, agent="demo", input={"deltas": 1, "delay_ms": 0, **tool})
        started = wait_until(lambda: _under_way(run.pk, kind), 60, f"the {kind} step of run {run.pk}")
        t0 = time.time()
        services.run_cancel(run_id=run.pk, actor=ctx.user, note="bench")
        committed = time.time()
        attempt = wait_until(lambda: released(run), 30, f"the release of run {run.pk}")
        assert started is not None and attempt is not None and attempt.released_at is not None
        sample: dict[str, Any] = {
            "run_id": str(run.pk),
            "committed_at": committed,
            "under_way_ms": (t0 - created) * 1000,
            "committed_ms": (committed - t0) * 1000,
            "released_after_commit_ms": (attempt.released_at.timestamp() - committed) * 1000,
            "outcome": attempt.outcome,
        }
        if kind == PROCESS:
            # Its process group (the child and the grandchild it starts) is gone by the release.
            sample["group_left"] = group_members(started.data["pid"])
        if server is not None:
            wait_until(server.disconnected.is_set, 10, "the model server seeing the disconnect")
            assert server.disconnected_at is not None
            sample["server_disconnect_after_commit_ms"] = (server.disconnected_at - committed) * 1000
    return sample


def _log_problem(run_id: str, kind: str) -> str | None:
    """None when the run is cancelled and its log sound: seq gap-free, one terminal event, and
    the expected last two events (`EXPECTED_TAIL`) — its tool call's only finish the seal."""
    run = Run.objects.get(pk=run_id)
    try:
        events = assert_log_is_sound(run)
    except AssertionError as exc:
        return f"run {run_id}: {exc!r}"
    tail = [(e.type, e.data.get("status") if e.type == EventType.TOOL_FINISHED else None) for e in events[-2:]]
    finishes = [e.data.get("status") for e in events if e.type == EventType.TOOL_FINISHED]
    sealed = [] if kind == HTTP else [ToolStatus.INTERRUPTED]
    if run.status != "cancelled" or tail != EXPECTED_TAIL[kind] or finishes != sealed:
        return f"run {run_id} ({run.status}) ends with {tail}; tool finishes {finishes}"
    return None


def _kind_report(kind: str, samples: list[dict[str, Any]]) -> dict[str, Any]:
    problems = [p for s in samples if (p := _log_problem(s["run_id"], kind)) is not None]
    report: dict[str, Any] = {
        "released_after_commit_ms": summary([s["released_after_commit_ms"] for s in samples]),
        "cancel_committed_ms": summary([s["committed_ms"] for s in samples]),
        # Create → the step seen under way (the bench's poll included): how long a sample takes.
        "under_way_after_create_ms": summary([s["under_way_ms"] for s in samples]),
        "outcomes": dict(Counter(str(s["outcome"]) for s in samples)),
        "logs_sound": len(samples) - len(problems),
        "log_problems": problems[:5],
        # Each run and its figures, for a second look (e.g. `bench/step_kinds.py --trace`).
        "samples": [
            {k: round(v, 6) if isinstance(v, float) else v for k, v in s.items() if k in SAMPLE_KEYS} for s in samples
        ],
    }
    if kind == PROCESS:
        report["groups_left_at_release"] = [s["group_left"] for s in samples if s["group_left"]][:5]
    if kind == HTTP:
        report["server_disconnect_after_commit_ms"] = summary([s["server_disconnect_after_commit_ms"] for s in samples])
    return report


def cancel_each_kind(ctx: Ctx, *, samples: int, tool_ms: int) -> dict[str, Any]:
    """`samples` cancels of each kind, one at a time, the kinds taken in turn (so that the
    machine's noise falls on every kind alike)."""
    taken: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    cpu = CpuMeter({"web": ctx.web.pid, **{f"worker{i}": w.pid for i, w in enumerate(ctx.workers)}})
    began = time.time()
    for _ in range(samples):
        for kind in KINDS:
            taken[kind].append(_cancel_one(ctx, kind, tool_ms))
    seconds = time.time() - began
    load = cpu.stop()
    try:
        return {
            "kinds": {kind: _kind_report(kind, runs) for kind, runs in taken.items()},
            "seconds": round(seconds, 1),
            "cpu": load,
        }
    finally:
        connection.close()


def _deltas_per_s(ids: list[Any], since: float, until: float) -> float:
    """Deltas the background runs committed per second between two wall-clock times."""
    window = (datetime.fromtimestamp(since, UTC), datetime.fromtimestamp(until, UTC))
    count = RunEvent.objects.filter(run_id__in=ids, type=EventType.OUTPUT_DELTA, created_at__range=window).count()
    return round(count / max(until - since, 1e-9), 1)


def _cancel_all(ctx: Ctx, ids: list[Any]) -> None:
    for run_id in ids:
        services.run_cancel(run_id=run_id, actor=ctx.user, note="bench: the background load ends")
    sc.wait_for(
        lambda: RunAttempt.objects.filter(run_id__in=ids, released_at__isnull=False).count() == len(ids),
        120,
        "the background runs' releases",
        interval=0.25,
    )


def step_kinds(
    ctx: Ctx, *, samples: int, background: int, delay_ms: int, tool_ms: int, floor: list[str] | None = None
) -> dict[str, Any]:
    """Per kind of step, cancel committed → released: one at a time with nothing else running,
    then the same on top of `background` demo runs streaming a delta every `delay_ms`.

    `floor` (bench/floor.py's command line): the floor measured once more while the background
    runs stream, just before the cancels under load."""
    result: dict[str, Any] = {
        "samples_per_kind": samples,
        "tool_ms": tool_ms,
        "cancel_grace_seconds": grace_seconds(),
        "waits_by_design_ms": waits_ms(),
        "targets_p99_ms_one_at_a_time": targets_p99_ms(),
        "alone": cancel_each_kind(ctx, samples=samples, tool_ms=tool_ms),
    }
    ids, floor_under_load = sc.streaming_runs(ctx, runs=background, delay_ms=delay_ms, floor=floor)
    try:
        began = time.time()
        loaded = cancel_each_kind(ctx, samples=samples, tool_ms=tool_ms)
        loaded["background_runs"] = background
        loaded["background_delay_ms"] = delay_ms
        # The load held throughout: every background run still running, streaming at its pace.
        loaded["background_running_after"] = Run.objects.filter(pk__in=ids, status="running").count()
        loaded["background_deltas_per_s"] = _deltas_per_s(ids, began, time.time())
        loaded["floor_under_load"] = floor_under_load
        result["under_load"] = loaded
    finally:
        _cancel_all(ctx, ids)
    return result
