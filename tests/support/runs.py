"""A run as the database holds it: its row, attempts and events, read afresh every time, so that
a test sees what another process or thread committed."""

from runs.events import EventType
from runs.models import Run, RunAttempt, RunEvent
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


def assert_exact_log(events: list[Event], run: Run, after: int = 0) -> None:
    """The events (as a stream delivered them) are exactly the stored ones after `after`: no gap,
    no duplicate, in order."""
    rows = list(RunEvent.objects.filter(run=run, seq__gt=after).order_by("seq"))
    assert [e.seq for e in events] == [r.seq for r in rows]
    assert [e.event for e in events] == [r.type for r in rows]
    assert [e.json() for e in events] == [r.as_dict() for r in rows]
