"""What must hold of runs once the dust settles, read straight from the database: of one run's
log, of a run's attempts, and of every run of a fault-injection workload (tests/worker/test_faults.py)."""

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from typing import Any, TypeVar
from uuid import UUID

from runs.agents.demo import demo_text
from runs.events import TERMINAL_EVENT, TERMINAL_EVENT_TYPES, EventType, ToolStatus, WaitReason
from runs.models import AttemptOutcome, Run, RunAttempt, RunEvent
from runs.transitions import TERMINAL
from tests.factories import assert_log_is_sound
from tests.support.faults import Watch
from tests.support.procs import Procs
from tests.support.runs import fresh


def assert_nothing_after_terminal(run: Run) -> None:
    run = fresh(run)
    events = assert_log_is_sound(run)
    assert events[-1].type == TERMINAL_EVENT[run.status]


def assert_tool_call_sealed(run: Run) -> None:
    """The run ended during its one tool call: the call's only finish is the platform's
    `interrupted` seal, just before the terminal event (no late result of the tool was stored)."""
    events = assert_log_is_sound(fresh(run))
    finishes = [e for e in events if e.type == EventType.TOOL_FINISHED]
    assert [e.data["status"] for e in finishes] == [ToolStatus.INTERRUPTED], [e.data for e in finishes]
    assert events[-2] == finishes[0]


def assert_attempts_never_overlap(attempts: list[RunAttempt]) -> None:
    """No two attempts of one run executed at the same instant.

    An attempt executes from `claimed_at` until `released_at`, which its worker records as the
    moment it stopped (even if the database was down then). An attempt without `released_at`
    either never started executing (its claim's answer was lost) or its worker died; in both cases
    it executed no later than its lease, which self-fencing guarantees. The next attempt is only
    claimed after the run was requeued, so each attempt must have ended before the next began."""
    attempts = sorted(attempts, key=lambda a: a.generation)
    assert [a.generation for a in attempts] == list(range(1, len(attempts) + 1))
    for earlier, later in pairwise(attempts):
        ended: datetime = earlier.released_at or earlier.lease_expires_at
        assert ended <= later.claimed_at, (earlier.run_id, earlier.generation, ended, later.claimed_at)
    for attempt in attempts:
        if attempt.outcome == AttemptOutcome.LOST and attempt.released_at is not None:
            # Self-fencing: a worker that lost its lease had stopped before the lease lapsed.
            assert attempt.released_at <= attempt.lease_expires_at, (attempt.run_id, attempt.generation)


# --- after a fault-injection workload -------------------------------------------------------------

# What a process logs when something failed that must not: a 500, an execution or background task
# that died of an exception, a traceback of any kind. Warnings about the database are expected.
CRASH_SIGNS = (
    "Traceback",
    "Internal Server Error",
    "Exception in ASGI application",
    "ended with an error",
    "the driver failed",
    "background task stopped",
)


def assert_no_crash_logged(procs: Procs) -> None:
    """No process the test started (killed ones included) logged a crash."""
    for proc in procs.started:
        log = proc.log()
        found = [sign for sign in CRASH_SIGNS if sign in log]
        assert not found, f"{proc.name} (pid {proc.pid}) logged {found}:\n{log[-5000:]}"


@dataclass
class Checked:
    runs: int = 0
    statuses: Counter[str] = field(default_factory=Counter)  # "<status> <end_code>"
    attempts: int = 0
    lost_attempts: int = 0
    requeued_runs: int = 0
    streams: int = 0
    stream_events: int = 0


def assert_generations_fenced(run: Run, events: list[RunEvent]) -> None:
    """Each attempt wrote only while it held the run: between its own `run.started` and the next
    attempt's, and nothing after the `run.requeued` that ended it."""
    started = {e.attempt: e.seq for e in events if e.type == EventType.RUN_STARTED}
    assert sorted(started) == list(range(1, run.generation + 1)), run.pk
    for e in events:
        if e.attempt is not None:
            assert started[e.attempt] <= e.seq, (run.pk, e.seq, e.type, e.attempt)
            if e.attempt + 1 in started:
                assert e.seq < started[e.attempt + 1], (run.pk, e.seq, e.type, e.attempt)
    for requeued in (e for e in events if e.type == EventType.RUN_REQUEUED):
        generation = requeued.data["generation"]
        assert requeued.attempt is None
        late = [e.seq for e in events if e.attempt == generation and e.seq > requeued.seq]
        assert late == [], f"run {run.pk}: attempt {generation} wrote {late} after it was requeued"


def assert_answer_echoed(run: Run, events: list[RunEvent]) -> None:
    """A completed run that asked echoes the input of the resume that answered it."""
    asked = next(
        e.seq for e in events if e.type == EventType.RUN_WAITING and e.data["reason"] == WaitReason.INPUT_REQUIRED
    )
    answer = next(e.data["input"] for e in events if e.type == EventType.RUN_RESUMED and e.seq > asked)
    assert run.output["answer"] == answer, run.pk


Row = TypeVar("Row", RunEvent, RunAttempt)


def by_run(rows: Iterable[Row]) -> defaultdict[UUID, list[Row]]:
    """Rows of many runs grouped by run, each group in the order given."""
    grouped: defaultdict[UUID, list[Row]] = defaultdict(list)
    for row in rows:
        grouped[row.run_id].append(row)
    return grouped


def check_runs(
    runs: list[Run],
    *,
    cancelled_by_client: set[str] | None = None,
    stopped_by_client: set[str] | None = None,
    watches: Sequence[Watch] = (),
) -> Checked:
    """Every run is terminal with a sound log (gap-free seq, one terminal event, last), no attempt
    wrote outside its tenure or overlapped another, completed runs hold exactly one uninterrupted
    run's text, every end has a cause a client asked for (a dropped connection cancels nothing),
    and every watcher's reassembled stream is the stored log, event for event."""
    ids = [r.pk for r in runs]
    events_by_run = by_run(RunEvent.objects.filter(run_id__in=ids).order_by("run_id", "seq"))
    attempts_by_run = by_run(RunAttempt.objects.filter(run_id__in=ids))
    by_id = {r.pk: r for r in runs}
    checked = Checked()
    for run in runs:
        events = events_by_run[run.pk]
        assert run.status in TERMINAL, f"run {run.pk} is still {run.status}"
        assert [e.seq for e in events] == list(range(1, run.last_seq + 1)), run.pk
        assert events[0].type == EventType.RUN_CREATED, run.pk
        terminal = [e.type for e in events if e.type in TERMINAL_EVENT_TYPES]
        assert terminal == [TERMINAL_EVENT[run.status]] and events[-1].type == terminal[0], (run.pk, terminal)
        assert_generations_fenced(run, events)
        attempts = attempts_by_run[run.pk]
        assert len(attempts) == run.generation, run.pk
        assert_attempts_never_overlap(attempts)
        # Every lost attempt is counted, but for one: the last, when the run ended under it (a
        # cancel, a deadline) and its worker died before it could say it stopped.
        lost = [a.generation for a in sorted(attempts, key=lambda a: a.generation) if a.outcome == AttemptOutcome.LOST]
        uncounted = len(lost) - run.lost_attempts
        assert uncounted == 0 or (uncounted == 1 and lost[-1] == run.generation), (run.pk, lost, run.lost_attempts)
        _assert_end_has_a_cause(run, by_id, cancelled_by_client, stopped_by_client)
        if run.status == "completed":
            deltas = run.input["deltas"]
            assert "".join(e.data["text"] for e in events if e.type == EventType.OUTPUT_DELTA) == demo_text(deltas), (
                run.pk
            )
            assert run.output["text"] == demo_text(deltas), run.pk
            if run.input.get("ask") is not None:
                assert_answer_echoed(run, events)
        checked.runs += 1
        checked.statuses[f"{run.status} {run.end_code}".strip()] += 1
        checked.attempts += len(attempts)
        checked.lost_attempts += run.lost_attempts
        checked.requeued_runs += any(e.type == EventType.RUN_REQUEUED for e in events)
    for watch in watches:
        stored = events_by_run[UUID(watch.run_id)]
        assert watch.final_status == 204, watch.run_id
        assert [e.seq for e in watch.events] == [e.seq for e in stored], watch.run_id
        assert [e.event for e in watch.events] == [e.type for e in stored], watch.run_id
        assert [e.json() for e in watch.events] == [e.as_dict() for e in stored], watch.run_id
        checked.streams += 1
        checked.stream_events += len(watch.events)
    return checked


def _assert_end_has_a_cause(
    run: Run, by_id: dict[UUID, Run], cancelled: set[str] | None, stopped: set[str] | None
) -> None:
    parent: Any = by_id.get(run.parent_id) if run.parent_id else None
    code = run.end_code
    if run.status == "failed":
        # Only the platform fails a demo run here: its lost attempts ran out.
        assert code == "worker_lost" and run.lost_attempts == run.max_attempts, (run.pk, code, run.end_reason)
    elif run.status == "cancelled":
        if code.startswith("parent_"):
            assert parent is not None, run.pk
            expected = "parent_cancelled" if parent.status == "cancelled" else "parent_ended"
            assert code == expected and parent.status != "stopped", (run.pk, code, parent.status)
        else:
            assert cancelled is not None and str(run.pk) in cancelled, f"run {run.pk} cancelled ({code}) unasked"
            assert code == "cancelled_by_user", (run.pk, code)
    elif run.status == "stopped":
        if code == "parent_stopped":
            assert parent is not None and parent.status == "stopped", run.pk
        else:
            assert stopped is not None and str(run.pk) in stopped, f"run {run.pk} stopped ({code}) unasked"
            assert code == "policy", (run.pk, code)
