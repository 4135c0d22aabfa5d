"""A run as the database holds it: its row, attempts and events, read afresh every time, so that
a test sees what another process or thread committed."""

from typing import Any

from django.contrib.auth.models import User

from runs import services
from runs.events import TERMINAL_EVENT_TYPES, EventType
from runs.models import Run, RunAttempt, RunEvent
from tests.factories import running_run
from tests.support.sse import Event


def fresh(run: Run) -> Run:
    return Run.objects.get(pk=run.pk)


def status_of(run: Run) -> str:
    return str(Run.objects.values_list("status", flat=True).get(pk=run.pk))


def attempt(run: Run, generation: int = 1) -> RunAttempt | None:
    return RunAttempt.objects.filter(run_id=run.pk, generation=generation).first()


def released(run: Run, generation: int = 1) -> RunAttempt | None:
    found = attempt(run, generation)
    return found if found is not None and found.released_at is not None else None


def event_types(run: Run) -> list[str]:
    return list(RunEvent.objects.filter(run_id=run.pk).order_by("seq").values_list("type", flat=True))


def stored_text(run: Run) -> str:
    deltas = RunEvent.objects.filter(run_id=run.pk, type=EventType.OUTPUT_DELTA).order_by("seq")
    return "".join(e.data["text"] for e in deltas)


def delta_texts(run: Run, generation: int | None = None) -> list[str]:
    """The text of each stored output.delta in seq order (of one attempt's, given its generation)."""
    deltas = RunEvent.objects.filter(run_id=run.pk, type=EventType.OUTPUT_DELTA).order_by("seq")
    if generation is not None:
        deltas = deltas.filter(attempt=generation)
    return [e.data["text"] for e in deltas]


def delta_count(run: Run) -> int:
    return RunEvent.objects.filter(run_id=run.pk, type=EventType.OUTPUT_DELTA).count()


def deltas_of(run: Run, generation: int) -> int:
    return RunEvent.objects.filter(run_id=run.pk, type=EventType.OUTPUT_DELTA, attempt=generation).count()


def assert_stopped_by_the_system(run: Run, code: str, reason: str, *, partial_output: bool) -> None:
    """`run` (read afresh) was stopped by the platform for `code`, its run.stopped event last and
    of no attempt."""
    run.refresh_from_db()
    assert (run.status, run.end_code, run.ended_by) == ("stopped", code, "system")
    assert run.end_reason == reason
    last = RunEvent.objects.get(run=run, seq=run.last_seq)
    assert (last.type, last.attempt) == ("run.stopped", None)
    assert last.data == {"code": code, "reason": reason, "by": "system", "partial_output": partial_output}


def assert_exact_log(events: list[Event], run: Run, after: int = 0) -> None:
    """The events (as a stream delivered them) are exactly the stored ones after `after`: no gap,
    no duplicate, in order."""
    rows = list(RunEvent.objects.filter(run=run, seq__gt=after).order_by("seq"))
    assert [e.seq for e in events] == [r.seq for r in rows]
    assert [e.event for e in events] == [r.type for r in rows]
    assert [e.json() for e in events] == [r.as_dict() for r in rows]


def mixed_run(owner: User, *, complete: bool = True) -> Run:
    """A running run of the owner's with seq 1 run.created, 2 run.started, then six turns of
    output.delta, tool.started and tool.finished, then (`complete`) run.completed."""
    run = running_run(owner)
    events: list[tuple[str, dict[str, Any]]] = []
    for i in range(6):
        events.append((EventType.OUTPUT_DELTA, {"text": f"d{i}"}))
        events.append((EventType.TOOL_STARTED, {"call_id": f"c{i}", "name": "t"}))
        events.append((EventType.TOOL_FINISHED, {"call_id": f"c{i}", "name": "t"}))
    services.run_events_append(run_id=run.pk, generation=run.generation, events=events)
    if complete:
        services.run_complete(run_id=run.pk, generation=run.generation, output="ok")
    run.refresh_from_db()
    return run


def chosen_seqs(run: Run, *types: str, prefixes: tuple[str, ...] = ()) -> list[int]:
    """The seqs a selection of `types` and `prefixes` (`?types=`) takes of the stored events: the
    terminal one always."""
    rows = RunEvent.objects.filter(run=run).order_by("seq")
    return [e.seq for e in rows if e.type in types or e.type.startswith(prefixes) or e.type in TERMINAL_EVENT_TYPES]
