"""The state gauges, read from the database at scrape time: every process sees the same rows, so
they need no counting in the processes (and each scraped web process reports the same values:
aggregate them with `max`, never `sum`)."""

from collections.abc import Iterator

from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from runs.models import AttemptOutcome, Run, RunAttempt
from runs.services.core import db_now
from runs.transitions import Status


class DatabaseCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        now = db_now()
        # One index-only scan of run_status_created; its cost is in README ("Operating it").
        counts = dict(Run.objects.order_by().values_list("status").annotate(n=Count("*")))
        runs = GaugeMetricFamily("runledger_runs", "Runs by status", labels=["status"])
        for status in Status:
            runs.add_metric([status.value], counts.get(status.value, 0))
        yield runs
        # The claim's order (oldest created first), through the queued-runs index.
        oldest = (
            Run.objects.filter(status=Status.QUEUED).order_by("created_at").values_list("created_at", flat=True).first()
        )
        age = max(0.0, (now - oldest).total_seconds()) if oldest is not None else 0.0
        yield GaugeMetricFamily(
            "runledger_queue_oldest_age_seconds", "Age of the oldest queued run (since it was created)", value=age
        )
        # Held attempts whose lease lapsed and that no sweeper has requeued yet: through the
        # open-lease partial index. Above 0 for longer than a few sweeps means nobody sweeps.
        stale = RunAttempt.objects.filter(outcome=AttemptOutcome.RUNNING, lease_expires_at__lt=now).count()
        yield GaugeMetricFamily("runledger_leases_stale", "Open attempts whose lease has lapsed", value=stale)
