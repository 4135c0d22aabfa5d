"""Runs in each state, made through the services — never by writing rows by hand."""

from typing import Any

from django.contrib.auth.models import User

from runs import services
from runs.events import TERMINAL_EVENT, TERMINAL_EVENT_TYPES, WaitReason
from runs.models import Run, RunEvent
from runs.transitions import TERMINAL


def queued_run(owner: User, **kwargs: Any) -> Run:
    kwargs.setdefault("agent", "demo")
    kwargs.setdefault("input", {"deltas": 3})
    return services.run_create(owner=owner, **kwargs)


def running_run(owner: User, **kwargs: Any) -> Run:
    run = queued_run(owner, **kwargs)
    claimed = services.run_claim(worker="test-worker")
    assert claimed is not None and claimed[0].pk == run.pk, "another queued run was claimed first"
    return claimed[0]


def waiting_run(owner: User, **kwargs: Any) -> Run:
    run = running_run(owner, **kwargs)
    return services.run_wait(run_id=run.pk, generation=run.generation, reason=WaitReason.INPUT_REQUIRED, prompt="name?")


def assert_log_is_sound(run: Run) -> list[RunEvent]:
    """seq is 1..last_seq with no gap; a terminal run has exactly one terminal event, last."""
    run.refresh_from_db()
    events = list(RunEvent.objects.filter(run=run).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, run.last_seq + 1))
    terminal = [e for e in events if e.type in TERMINAL_EVENT_TYPES]
    if run.status in TERMINAL:
        assert len(terminal) == 1, [e.type for e in terminal]
        assert events[-1].type == TERMINAL_EVENT[run.status]
    else:
        assert terminal == []
    return events
