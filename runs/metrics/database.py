"""The state gauges, read from the database at scrape time: every process sees the same rows, so
they need no counting in the processes (and each scraped web process reports the same values:
aggregate them with `max`, never `sum`)."""

import time
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from runs.models import LIVE_VALUES
from runs.selectors.clock import db_now
from runs.selectors.overview import leases_stale, queue_oldest_entered, status_counts
from runs.selectors.webhooks import webhooks_oldest_pending
from runs.transitions import TERMINAL, Status

# Ended runs only accumulate (until purge_runs), and counting them reads every one of them (about
# 30 ms per 100,000 here): they are recounted at most this often per process. The live ones, which
# the alerts watch, are counted at every scrape through the live-runs partial index (~0.03 ms).
TERMINAL_RECOUNT_SECONDS = 60.0
_terminal: tuple[float, dict[str, int]] = (-TERMINAL_RECOUNT_SECONDS, {})


def _terminal_counts() -> dict[str, int]:
    global _terminal
    counted_at, counts = _terminal
    if time.monotonic() - counted_at >= TERMINAL_RECOUNT_SECONDS:
        counts = status_counts(sorted(s.value for s in TERMINAL))
        _terminal = (time.monotonic(), counts)
    return counts


class DatabaseCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        now = db_now()
        counts = {**_terminal_counts(), **status_counts(LIVE_VALUES)}
        runs = GaugeMetricFamily("runledger_runs", "Runs by status", labels=["status"])
        for status in Status:
            runs.add_metric([status.value], counts.get(status.value, 0))
        yield runs
        oldest = queue_oldest_entered()
        age = max(0.0, (now - oldest).total_seconds()) if oldest is not None else 0.0
        yield GaugeMetricFamily(
            "runledger_queue_oldest_age_seconds",
            "How long the queued run that has waited longest has been queued (since it was created, requeued or resumed)",
            value=age,
        )
        # Above 0 for longer than a few sweeps means nobody sweeps.
        yield GaugeMetricFamily(
            "runledger_leases_stale", "Open attempts whose lease has lapsed", value=leases_stale(now=now)
        )
        oldest = webhooks_oldest_pending()
        yield GaugeMetricFamily(
            "runledger_webhooks_oldest_pending_age_seconds",
            "How long the oldest webhook notification still to deliver (to an enabled endpoint) has waited",
            value=max(0.0, (now - oldest).total_seconds()) if oldest is not None else 0.0,
        )
