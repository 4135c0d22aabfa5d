"""What the working processes count, each where the work happens
(docs/design/operations.md#metrics).

Counts are taken after commit (`transaction.on_commit`): an append or a requeue that rolled back
(and is retried) did not happen. Each costs an mmap write of a few microseconds and no database
statement; `robust` so that a failing count (a full disk) is logged, never raised at a caller whose
write has committed.
"""

import functools
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.db import transaction
from prometheus_client import Counter, Gauge, Histogram

from runs.events import USAGE_INCOMPLETE, FireOutcome
from runs.metrics import store
from runs.selectors.overview import cancel_release_seconds


class Series:
    """Every metric this process counts. Not registered anywhere: a scrape reads every process's
    files (`runs.metrics.views`)."""

    def __init__(self) -> None:
        self.EVENTS_APPENDED = Counter(
            "runledger_events_appended", "Events appended to runs (by workers, commands and the sweeper)", registry=None
        )
        self.ATTEMPTS_LOST = Counter(
            "runledger_attempts_lost",
            "Attempts whose worker was lost: its lease lapsed before it released the run",
            registry=None,
        )
        # Observed for each attempt `runs.selectors.overview.CANCELLED_UNDER` counts, when it is
        # released (by its worker, or by a sweeper at its lease's lapse): the dashboard's latencies
        # are the same.
        self.CANCEL_RELEASE = Histogram(
            "runledger_cancel_release_seconds",
            "From a cancel or stop committed to the worker's release of the attempt it ended",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=None,
        )
        # livesum: the open streams of the processes alive now; a dead process's share is dropped at
        # the next scrape (`store.forget_dead`).
        self.SSE_STREAMS_OPEN = Gauge(
            "runledger_sse_streams_open", "SSE streams open", multiprocess_mode="livesum", registry=None
        )
        # By agent and counter (`usage.reported`, docs/design/events.md#usage): both bounded, by the
        # agents registered and the counters each reports (runs.events.USAGE_COUNTERS_MAX).
        self.USAGE = Counter(
            "runledger_usage",
            "What agents reported they used (usage.reported), by counter",
            ["agent", "counter"],
            registry=None,
        )
        self.WEBHOOK_DELIVERIES = Counter(
            "runledger_webhook_deliveries",
            "Webhook delivery attempts, by outcome: success (a 2xx) or failure (any other answer, or none)",
            ["outcome"],
            registry=None,
        )
        self.webhooks_by_outcome = {
            outcome: self.WEBHOOK_DELIVERIES.labels(outcome=outcome) for outcome in ("success", "failure")
        }
        self.HTTP_REQUESTS = Counter(
            "runledger_http_requests", "HTTP requests answered, by status", ["status"], registry=None
        )
        self.http_by_status = {status: self.HTTP_REQUESTS.labels(status=str(status)) for status in HTTP_STATUSES}
        # By outcome (runs.events.FireOutcome, docs/design/schedules.md#metrics), each present from
        # the first scrape.
        self.SCHEDULE_FIRES = Counter(
            "runledger_schedule_fires", "Schedules' due times, by what each did", ["outcome"], registry=None
        )
        self.fires_by_outcome = {outcome: self.SCHEDULE_FIRES.labels(outcome=outcome) for outcome in FireOutcome}
        self.SCHEDULE_LATENESS = Histogram(
            "runledger_schedule_lateness_seconds",
            "From a schedule's due time to the commit of its fire",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=None,
        )


# The statuses Runledger answers with, present (at 0) from the first scrape; others appear when used.
HTTP_STATUSES = (200, 201, 202, 204, 301, 302, 304, 400, 401, 403, 404, 405, 409, 413, 422, 429, 500, 503)


@functools.cache
def made() -> Series:
    """This process's metrics, made at its first count (or its start: runworker, the ASGI wrapper),
    never at import: the store goes into multiprocess mode first, so every one is exported."""
    store.install()
    return Series()


def events_appended(count: int) -> None:
    transaction.on_commit(functools.partial(made().EVENTS_APPENDED.inc, count), robust=True)


def attempts_lost(count: int) -> None:
    if count:
        transaction.on_commit(functools.partial(made().ATTEMPTS_LOST.inc, count), robust=True)


def usage_reported(agent: str, report: Mapping[str, Any]) -> None:
    for counter, value in report.items():
        if counter != USAGE_INCOMPLETE and value:
            inc = made().USAGE.labels(agent=agent, counter=counter).inc
            transaction.on_commit(functools.partial(inc, value), robust=True)


def cancel_released(*, ended_at: datetime, released_at: datetime) -> None:
    seconds = cancel_release_seconds(ended_at=ended_at, released_at=released_at)
    transaction.on_commit(functools.partial(made().CANCEL_RELEASE.observe, seconds), robust=True)


def webhook_delivered(outcome: str) -> None:
    # Counted when the answer came: its record may fail, and the request was still sent.
    made().webhooks_by_outcome[outcome].inc()


def schedule_fired(outcome: str, *, lateness: float, missed: int) -> None:
    """A due time fired (`outcome`), `lateness` seconds after it, with `missed` earlier ones
    passed over by catch-up."""

    def count() -> None:
        metrics = made()
        metrics.fires_by_outcome[FireOutcome(outcome)].inc()
        metrics.SCHEDULE_LATENESS.observe(max(0.0, lateness))
        if missed:
            metrics.fires_by_outcome[FireOutcome.MISSED].inc(missed)

    transaction.on_commit(count, robust=True)


def http_response(status: int) -> None:
    metrics = made()
    counter = metrics.http_by_status.get(status)
    if counter is None:
        counter = metrics.http_by_status.setdefault(status, metrics.HTTP_REQUESTS.labels(status=str(status)))
    counter.inc()


def stream_opened() -> None:
    made().SSE_STREAMS_OPEN.inc()


def stream_closed() -> None:
    made().SSE_STREAMS_OPEN.dec()
