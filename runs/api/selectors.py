"""Reads the API composes from `runs.selectors` (visibility stays there).

They could move into `runs/selectors.py`; they live here because only the API uses them so far.
"""

from dataclasses import dataclass

from django.db.models import F, Prefetch, QuerySet

from runs.conf import conf
from runs.events import TypeSelection
from runs.exceptions import ValidationFailed
from runs.models import Run, RunAttempt
from runs.selectors.event_text import run_events_items
from runs.transitions import is_terminal


def run_with_current_attempt(*, runs: QuerySet[Run]) -> QuerySet[Run]:
    """Prefetch each run's current attempt into `current_attempts` (0 or 1 item): one query for
    a whole page instead of one per run."""
    current = RunAttempt.objects.filter(generation=F("run__generation"))
    return runs.prefetch_related(Prefetch("attempts", queryset=current, to_attr="current_attempts"))


@dataclass(frozen=True)
class EventsPage:
    # The events' JSON texts joined by "," (`runs.selectors.event_json`, the bytes SSE sends too).
    items: str
    next_after_seq: int
    last_seq: int
    run_status: str
    end_of_stream: bool


def run_events_page(*, run: Run, after_seq: int, limit: int, types: TypeSelection | None = None) -> EventsPage:
    """Events with seq > after_seq (docs/design/streaming.md#json-pages) of a run the caller may
    see: at most `limit`, and at most RUNLEDGER_MAX_PAGE_BYTES of them (one at least); with
    `types`, only those of the chosen types (docs/design/streaming.md#types)."""
    if after_seq > run.last_seq:
        raise ValidationFailed(
            f"after_seq {after_seq} is past the run's last event ({run.last_seq})",
            detail={"after_seq": [f"must be at most {run.last_seq}"]},
        )
    page = run_events_items(run_id=run.pk, after_seq=after_seq, limit=limit, max_bytes=conf.MAX_PAGE_BYTES, types=types)
    # The run's state is read with its events (one snapshot), else after them: either way last_seq
    # covers every event returned, and a terminal status means the terminal event is stored, so
    # end_of_stream is never early.
    status, last_seq = page.run_state or Run.objects.filter(pk=run.pk).values_list("status", "last_seq").get()
    next_after_seq = after_seq if page.last_seq is None else page.last_seq
    return EventsPage(
        items=page.text,
        next_after_seq=next_after_seq,
        last_seq=last_seq,
        run_status=status,
        end_of_stream=is_terminal(status) and next_after_seq >= last_seq,
    )
