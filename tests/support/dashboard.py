"""What the staff dashboard should show, computed here from every row in plain Python — not through
the dashboard's own queries — and what a page shows, read from its charts' data attributes."""

import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from runs.admin.dashboard import LATENCY_EDGES
from runs.models import Run, RunAttempt, RunEvent

LIVE = ("queued", "running", "waiting")
ENDED = ("cancelled", "completed", "failed", "stopped")


@dataclass
class Figures:
    charts: dict[str, list[tuple[str, float]]]
    percentiles: dict[str, dict[str, float | None]]
    workers: dict[str, set[str]]
    stale: set[str]


def _nearest_rank(values: list[float], p: int) -> float | None:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)] if ordered else None


def _histogram(values: list[float]) -> list[int]:
    counts = [0] * (len(LATENCY_EDGES) + 1)
    for value in values:
        below = [i for i, edge in enumerate(LATENCY_EDGES) if value <= edge]
        counts[below[0] if below else len(LATENCY_EDGES)] += 1
    return counts


def _cancelled_under(attempt: RunAttempt, run: Run) -> bool:
    """`selectors.overview.CANCELLED_UNDER`, one attempt at a time: its run ended cancelled or
    stopped while it held the run — its outcome says so, or it was lost after the run last entered
    the queue (a lease lost before would have sent the run back to the queue after it)."""
    if run.status not in ("cancelled", "stopped") or attempt.generation != run.generation:
        return False
    if attempt.outcome == "lost":
        return None not in (attempt.released_at, run.queued_at) and attempt.released_at > run.queued_at
    return attempt.outcome in ("cancelled", "stopped")


def expected(now: datetime) -> Figures:
    runs = list(Run.objects.all())
    first_minute = now.replace(second=0, microsecond=0) - timedelta(minutes=59)
    minutes = [first_minute + timedelta(minutes=i) for i in range(60)]
    label = {m: f"{m:%H:%M} UTC" for m in minutes}

    def minute_of(when: datetime) -> datetime:
        return when.replace(second=0, microsecond=0)

    status = Counter(r.status for r in runs)
    ended_day = Counter(r.status for r in runs if r.ended_at and now - timedelta(days=1) <= r.ended_at <= now)
    ended_minute = Counter(minute_of(r.ended_at) for r in runs if r.ended_at and first_minute <= r.ended_at <= now)
    event_minute = Counter(
        minute_of(at) for at in RunEvent.objects.values_list("created_at", flat=True) if first_minute <= at <= now
    )
    by_id = {r.pk: r for r in runs}
    latencies: dict[str, list[float]] = {"hour": [], "day": []}
    workers: dict[str, set[str]] = defaultdict(set)
    stale = set()
    for attempt in RunAttempt.objects.all():
        if attempt.outcome == "" and attempt.lease_expires_at < now:
            stale.add(str(attempt.run_id))
        elif attempt.outcome == "":
            workers[attempt.worker].add(str(attempt.run_id))
        run = by_id[attempt.run_id]
        if _cancelled_under(attempt, run) and attempt.released_at and run.ended_at and attempt.released_at <= now:
            seconds = max(0.0, (attempt.released_at - run.ended_at).total_seconds())
            for window, span in (("hour", timedelta(hours=1)), ("day", timedelta(days=1))):
                if attempt.released_at >= now - span:
                    latencies[window].append(seconds)
    charts = {
        "runs-live": [(s, float(status[s])) for s in LIVE],
        "runs-ended-day": [(s, float(ended_day[s])) for s in ENDED],
        "events-per-second": [(label[m], event_minute[m] / 60) for m in minutes],
        "runs-ended-per-minute": [(label[m], float(ended_minute[m])) for m in minutes],
        **{
            f"cancel-latency-{w}": [(str(i), float(n)) for i, n in enumerate(_histogram(v))]
            for w, v in latencies.items()
        },
    }
    percentiles = {w: {f"p{p}": _nearest_rank(v, p) for p in (50, 95, 99)} for w, v in latencies.items()}
    return Figures(charts, percentiles, dict(workers), stale)


# Run in the page: every chart's bars, the percentiles, the workers' runs and the stale leases.
READ_PAGE = """() => {
  const charts = {};
  for (const svg of document.querySelectorAll('#rl-dashboard svg[data-chart]')) {
    charts[svg.dataset.chart] = [...svg.querySelectorAll('rect.rl-bar')].map(r => [r.dataset.label, Number(r.dataset.value)]);
  }
  const percentiles = {};
  for (const panel of document.querySelectorAll('#rl-dashboard [data-latency]')) {
    const window = panel.dataset.latency === '0' ? 'hour' : 'day';
    percentiles[window] = {};
    for (const span of panel.querySelectorAll('[data-percentile]')) {
      percentiles[window][span.dataset.percentile] = span.dataset.seconds === 'None' ? null : Number(span.dataset.seconds);
    }
  }
  const workers = {};
  for (const row of document.querySelectorAll('#rl-workers tr[data-worker]')) {
    workers[row.dataset.worker] = [...row.querySelectorAll('a[data-run]')].map(a => a.dataset.run);
  }
  const stale = [...document.querySelectorAll('#rl-stale tr[data-stale-run]')].map(r => r.dataset.staleRun);
  return {asOf: document.querySelector('#rl-dashboard .rl-figures').dataset.asOf, charts, percentiles, workers, stale};
}"""


def shown(read: dict[str, Any]) -> Figures:
    """The page's figures (READ_PAGE's result), in the shape of `expected`'s; the histograms'
    bars by their position, as `expected` numbers them."""
    charts = {}
    for name, bars in read["charts"].items():
        if name.startswith("cancel-latency-"):
            bars = [(str(i), value) for i, (_, value) in enumerate(bars)]
        charts[name] = [(label, float(value)) for label, value in bars]
    return Figures(
        charts,
        read["percentiles"],
        {worker: set(runs) for worker, runs in read["workers"].items()},
        set(read["stale"]),
    )


def assert_same(page: Figures, db: Figures) -> None:
    """Every figure equal; rates to the precision a float written in HTML keeps."""
    assert page.charts.keys() == db.charts.keys()
    for name, bars in db.charts.items():
        assert [label for label, _ in page.charts[name]] == [label for label, _ in bars], name
        for (label, value), (_, wanted) in zip(page.charts[name], bars, strict=True):
            assert math.isclose(value, wanted, abs_tol=1e-9), (name, label, value, wanted)
    for window, wanted in db.percentiles.items():
        for p, seconds in wanted.items():
            got = page.percentiles[window][p]
            assert (got is None and seconds is None) or math.isclose(got, seconds, abs_tol=1e-6), (window, p, got)
    assert page.workers == db.workers
    assert page.stale == db.stale
