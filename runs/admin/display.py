"""How the staff console writes times, durations, event data and statuses
(docs/design/operations.md#dashboard); the live tail (runs/static/runs/admin_tail.js) renders the
rows it appends the same way."""

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString


def run_form_page(
    model_admin: admin.ModelAdmin,
    request: HttpRequest,
    template: str,
    *,
    title: str,
    run: Any,
    form: Any,
    back_url: str,
) -> TemplateResponse:
    """A console page asking about one run through a form (rerun it, set its priority and start), in the admin's frame."""
    context: dict[str, Any] = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": title,
        "run": run,
        "form": form,
        "back_url": back_url,
        "media": model_admin.media,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, template, context)


def short_id(run_id: UUID | str) -> str:
    return str(run_id)[:8]


def run_link(run_id: UUID | None) -> SafeString | str:
    """A link to the run's page in the console, or a dash for none."""
    if run_id is None:
        return "—"
    url = reverse("admin:runs_run_change", args=[quote(run_id)])
    return format_html('<a href="{}">{}</a>', url, run_id)


def format_duration(delta: timedelta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {seconds}s"
    return f"{seconds}s"


def event_time(when: datetime) -> str:
    """UTC to the millisecond; admin_tail.js formats live rows the same way."""
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def moment(when: datetime | None) -> str:
    """UTC to the second: an on-call engineer compares times across runs and logs."""
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if when is not None else "—"


def event_summary(data: Any) -> str:
    """An event's data as `key: value` pairs; admin_tail.js renders live rows the same way."""
    if not isinstance(data, dict):
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    parts = []
    for key in sorted(data):
        value = data[key]
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        parts.append(f"{key}: {text}")
    return " · ".join(parts)


def status_badge(status: str, *, live: bool = False) -> SafeString:
    # data-rl-run-status marks the badge that the live tail updates when the run ends.
    if live:
        return format_html('<span class="rl-badge rl-status-{}" data-rl-run-status>{}</span>', status, status)
    return format_html('<span class="rl-badge rl-status-{}">{}</span>', status, status)


def pretty_json(value: Any) -> SafeString:
    return format_html('<pre class="rl-json">{}</pre>', json.dumps(value, indent=2, ensure_ascii=False))


def moment_field(field: str, description: str, *, ordering: str | None = None) -> Callable[[Any, Any], str]:
    """An admin display method showing the datetime `field` of its object as a `moment`."""

    @admin.display(description=description, ordering=ordering)
    def show(model_admin: Any, obj: Any) -> str:
        return moment(getattr(obj, field))

    return show


def json_field(field: str, description: str) -> Callable[[Any, Any], SafeString]:
    """An admin display method showing the JSON `field` of its object, indented."""

    @admin.display(description=description)
    def show(model_admin: Any, obj: Any) -> SafeString:
        return pretty_json(getattr(obj, field))

    return show
