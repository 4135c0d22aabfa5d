"""The staff dashboard, `/admin/runs/dashboard/` (docs/design/operations.md#dashboard): the whole
system at a glance.

The figures are `selectors.overview`'s, drawn by `charts` into the page's own HTML. The page asks
again for `?figures=1` every few seconds (runs/static/runs/dashboard.js) and swaps that fragment in
place: the same template, so the first paint and each refresh cannot differ.
"""

from datetime import datetime, timedelta
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.safestring import SafeString

from runs.access import sees_every_run
from runs.admin.charts import Bar, horizontal_bars, vertical_bars
from runs.admin.display import format_duration
from runs.admin.run import ViewOnly
from runs.conf import conf
from runs.models import Dashboard, Run
from runs.selectors.clock import db_now
from runs.selectors.overview import HeldRun, Latencies, Overview, system_overview
from runs.selectors.results import usage_by_agent
from runs.selectors.schedules import schedules_late
from runs.selectors.webhooks import webhooks_failing

# Upper edges of the latency histogram's buckets, in seconds (the last one is open): finer than
# /metrics/'s at the low end, where a healthy cancel lands.
LATENCY_EDGES = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
PERCENTILES = (50, 95, 99)


def _seconds(value: float | None) -> str:
    if value is None:
        return "—"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    return f"{value:.2f} s" if value < 10 else f"{value:.0f} s"


def latency_buckets(latencies: Latencies) -> list[Bar]:
    counts = [0] * (len(LATENCY_EDGES) + 1)
    for seconds in latencies.seconds:
        counts[next((i for i, edge in enumerate(LATENCY_EDGES) if seconds <= edge), len(LATENCY_EDGES))] += 1
    labels = [f"≤ {_seconds(edge)}" for edge in LATENCY_EDGES] + [f"> {_seconds(LATENCY_EDGES[-1])}"]
    return [Bar(label, count, css="rl-fill-latency") for label, count in zip(labels, counts, strict=True)]


def _latency(name: str, title: str, latencies: Latencies) -> dict[str, Any]:
    return {
        "title": title,
        "count": len(latencies.seconds),
        "capped": latencies.capped,
        "percentiles": [
            (f"p{p}", _seconds(latencies.percentile(p)), repr(latencies.percentile(p))) for p in PERCENTILES
        ],
        "chart": vertical_bars(
            name,
            f"{title}: cancel or stop → released",
            buckets := latency_buckets(latencies),
            first=buckets[0].label,
            last=buckets[-1].label,
            values=True,
        ),
    }


def _held(run: HeldRun, now: datetime) -> dict[str, Any]:
    return {
        "run": run,
        "url": reverse("admin:runs_run_change", args=[run.run_id]),
        "heartbeat_age": format_duration(now - run.heartbeat_at),
        "lease": format_duration(abs(run.lease_expires_at - now)),
    }


def _per_minute(name: str, title: str, overview: Overview, values: list[float], unit: str) -> SafeString:
    bars = [
        Bar(f"{minute:%H:%M} UTC", value, text=f"{value:,.2f} {unit}" if value % 1 else f"{value:,.0f} {unit}")
        for minute, value in zip(overview.minutes, values, strict=True)
    ]
    return vertical_bars(name, title, bars, first="60 min ago", last="now")


def figures(overview: Overview) -> dict[str, Any]:
    """The template's context: every figure the page shows, and its charts."""
    now = overview.now
    live = [Bar(status, n, css=f"rl-fill-{status}") for status, n in overview.live.items()]
    ended = [Bar(status, n, css=f"rl-fill-{status}") for status, n in overview.ended_last_day.items()]
    rates = [n / 60 for n in overview.events_per_minute]
    last_full_minute = overview.events_per_minute[-2] if len(overview.events_per_minute) > 1 else 0
    return {
        "now": now,
        "queue_depth": overview.queue_depth,
        "queue_age": format_duration(now - overview.queue_oldest) if overview.queue_oldest else "—",
        "live": overview.live,
        "ended_last_hour": sum(overview.ended_last_hour.values()),
        "events_per_second": f"{last_full_minute / 60:,.1f}",
        "workers": [
            {
                "name": w.name,
                "held": [_held(r, now) for r in w.held],
                "heartbeat_age": format_duration(now - w.last_heartbeat),
            }
            for w in overview.workers
        ],
        "stale": [_held(r, now) for r in overview.stale],
        "held_more": overview.held_more,
        "live_chart": horizontal_bars("runs-live", "Live runs by status", live),
        "ended_chart": horizontal_bars("runs-ended-day", "Runs ended in the last 24 hours, by status", ended),
        "events_chart": _per_minute("events-per-second", "Events per second, by minute", overview, rates, "events/s"),
        "ended_minute_chart": _per_minute(
            "runs-ended-per-minute",
            "Runs ended per minute",
            overview,
            [float(n) for n in overview.ended_per_minute],
            "runs",
        ),
        "latencies": [
            _latency("cancel-latency-hour", "Last hour", overview.cancel_latency_hour),
            _latency("cancel-latency-day", "Last 24 hours", overview.cancel_latency_day),
        ],
    }


def usage_rows(by_agent: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """The usage table: an agent a row, its counters as `name total` pairs."""
    return [
        {
            "agent": agent,
            "counters": [
                (name, f"{total:,.0f}" if total % 1 == 0 else f"{total:,.2f}") for name, total in counters.items()
            ],
        }
        for agent, counters in by_agent.items()
    ]


def failing_webhooks(now: datetime) -> list[dict[str, Any]]:
    """Endpoints failing every attempt now, or disabled for it (docs/design/webhooks.md#operations)."""
    return [
        {
            "endpoint": endpoint,
            "url": reverse("admin:runs_webhookendpoint_change", args=[endpoint.pk]),
            "since": format_duration(now - endpoint.failing_since) if endpoint.failing_since else "—",
        }
        for endpoint in webhooks_failing()
    ]


def late_schedules(now: datetime) -> list[dict[str, Any]]:
    """Active schedules whose due time passed and was not fired: no worker fires them
    (docs/design/schedules.md#scheduler)."""
    return [
        {
            "schedule": schedule,
            "url": reverse("admin:runs_schedule_change", args=[schedule.pk]),
            "late": format_duration(now - schedule.next_due_at) if schedule.next_due_at else "—",
        }
        for schedule in schedules_late(now=now)
    ]


@admin.register(Dashboard)
class DashboardAdmin(ViewOnly, admin.ModelAdmin):
    """The dashboard as the admin's page of `Dashboard`: one URL, for those who may see every run."""

    def get_urls(self) -> list[URLPattern]:
        name = f"{self.opts.app_label}_{self.opts.model_name}_changelist"
        return [path("", self.admin_site.admin_view(self.dashboard), name=name)]

    def dashboard(self, request: HttpRequest) -> HttpResponse:
        return dashboard_view(request, self.admin_site)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return sees_every_run(request.user)


def dashboard_view(request: HttpRequest, site: admin.AdminSite) -> HttpResponse:
    # The figures are of every run: for those who may see every run (docs/design/api.md#access),
    # staff or not being the admin site's own gate (admin_view, before this).
    if not sees_every_run(request.user):
        raise PermissionDenied
    now = db_now()
    context = {
        **figures(system_overview(now=now)),
        "usage": usage_rows(usage_by_agent(since=now - timedelta(days=1))),
        "failing_webhooks": failing_webhooks(now),
        "late_schedules": late_schedules(now),
    }
    if request.GET.get("figures") == "1":
        return TemplateResponse(request, "admin/runs/dashboard_figures.html", context)
    return TemplateResponse(
        request,
        "admin/runs/dashboard.html",
        {
            **site.each_context(request),
            **context,
            "title": "Runledger dashboard",
            "opts": Run._meta,
            "refresh_seconds": conf.DASHBOARD_REFRESH_SECONDS,
        },
    )
