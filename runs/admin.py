"""The staff console: find runs, inspect them, watch them live, cancel and stop them.

Thin by design: every change goes through `runs.services` — the same commands as the API, one
locked transaction per run — and the reads that are not trivial through `runs.selectors`. Nothing
here can edit a run's facts, events or attempts, nor add or delete them: the change form is
view-only, and the only writes are the cancel and stop commands, each behind its permission, a
confirmation page and a CSRF-protected POST.
"""

import json
import re
from collections import Counter
from datetime import UTC, datetime, timedelta
from math import ceil
from typing import Any
from uuid import UUID

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import flatten_fieldsets, quote, unquote
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from runs import selectors, services
from runs.agents import registered_names
from runs.events import browser_vocabulary
from runs.exceptions import NotFound, RunConflict
from runs.models import Run, RunAttempt, RunEvent
from runs.transitions import CALLER_STOP_CODES, TERMINAL, Status, StopCode

EVENTS_PER_PAGE = 100
CHILDREN_SHOWN = 20
# A bulk command runs one transaction per run inside the request; beyond this, narrow the filter.
MAX_BULK_RUNS = 1000
CONFIRMATION_SAMPLE = 20
# The owner filter lists this many owners at most; past that, search by username.
OWNERS_LISTED = 100
EVENTS_JSON_LIMIT = 500

# The event types of DESIGN §2. EventSource has no wildcard listener for named events, so the live
# tail listens for these; an event of another type shows up when the next known one reveals the
# gap in seq (the tail then fills it from the events JSON view).
EVENT_TYPES = (
    "run.created",
    "run.started",
    "output.delta",
    "tool.started",
    "tool.finished",
    "child.spawned",
    "run.waiting",
    "run.resumed",
    "run.requeued",
    "run.completed",
    "run.failed",
    "run.cancelled",
    "run.stopped",
)

_TERMINAL_EVENT_TYPES = frozenset(f"run.{status}" for status in TERMINAL)

_STOP_CODE_CHOICES = [(code.value, code.value) for code in StopCode if code in CALLER_STOP_CODES]

_ENDED_PHRASE: dict[str, str] = {
    Status.COMPLETED: "had already completed",
    Status.FAILED: "had already failed",
    Status.CANCELLED: "had already been cancelled",
    Status.STOPPED: "had already been stopped",
}


# --- display helpers ---------------------------------------------------------------------------


def _short(run_id: UUID | str) -> str:
    return str(run_id)[:8]


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


def _actor(request: HttpRequest) -> AbstractBaseUser:
    user = request.user
    if not isinstance(user, AbstractBaseUser):
        raise PermissionDenied
    return user


# --- list filters ------------------------------------------------------------------------------


class AgentFilter(admin.SimpleListFilter):
    """The registered agents: no DISTINCT over the whole run table on every page."""

    title = "agent"
    parameter_name = "agent"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [(name, name) for name in sorted(registered_names())]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Run]) -> QuerySet[Run]:
        return queryset.filter(agent=self.value()) if self.value() else queryset


class OwnerFilter(admin.SimpleListFilter):
    """Users who own runs, found from the users' side (one probe of the owner index per user)
    rather than by a DISTINCT over every run, which grows with the table."""

    title = "owner"
    parameter_name = "owner"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        User = get_user_model()
        owners = (
            User.objects.filter(Exists(Run.objects.filter(owner_id=OuterRef("pk"))))
            .order_by(User.USERNAME_FIELD)
            .values_list("pk", User.USERNAME_FIELD)[:OWNERS_LISTED]
        )
        return [(str(pk), str(name)) for pk, name in owners]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Run]) -> QuerySet[Run]:
        value = self.value()
        if not value:
            return queryset
        if not value.isdigit():
            return queryset.none()
        return queryset.filter(owner_id=int(value))


class HasParentFilter(admin.SimpleListFilter):
    title = "has parent"
    parameter_name = "has_parent"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("yes", "child runs"), ("no", "top-level runs")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Run]) -> QuerySet[Run]:
        if self.value() == "yes":
            return queryset.filter(parent__isnull=False)
        if self.value() == "no":
            return queryset.filter(parent__isnull=True)
        return queryset


class HeartbeatFilter(admin.SimpleListFilter):
    """Running runs whose worker has been silent for a whole lease: the sweeper should have
    requeued them, so finding any means no sweeper is running or it is falling behind."""

    title = "heartbeat"
    parameter_name = "heartbeat"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        lease = format_duration(timedelta(seconds=settings.RUNLEDGER_LEASE_SECONDS))
        return [("stale", f"stale (running, silent > {lease})"), ("fresh", "fresh (running)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Run]) -> QuerySet[Run]:
        if self.value() not in ("stale", "fresh"):
            return queryset
        cutoff = timezone.now() - timedelta(seconds=settings.RUNLEDGER_LEASE_SECONDS)
        silent = Exists(
            RunAttempt.objects.filter(run_id=OuterRef("pk"), generation=OuterRef("generation"), heartbeat_at__lt=cutoff)
        )
        running = queryset.filter(status=Status.RUNNING)
        return running.filter(silent) if self.value() == "stale" else running.exclude(silent)


class RunningForFilter(admin.SimpleListFilter):
    title = "running longer than"
    parameter_name = "running_for"
    periods = {
        "10m": ("10 minutes", timedelta(minutes=10)),
        "1h": ("1 hour", timedelta(hours=1)),
        "6h": ("6 hours", timedelta(hours=6)),
        "1d": ("1 day", timedelta(days=1)),
    }

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [(key, label) for key, (label, _) in self.periods.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Run]) -> QuerySet[Run]:
        choice = self.periods.get(self.value() or "")
        if choice is None:
            return queryset
        return queryset.filter(status=Status.RUNNING, started_at__lte=timezone.now() - choice[1])


# --- command forms -----------------------------------------------------------------------------


class CancelForm(forms.Form):
    note = forms.CharField(
        required=False,
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text="Optional. Recorded as the run's end reason and in its run.cancelled event.",
    )


class StopForm(forms.Form):
    code = forms.ChoiceField(label="Stop code", choices=_STOP_CODE_CHOICES, initial=StopCode.STAFF.value)
    reason = forms.CharField(
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text="Required. Recorded as the run's end reason and in its run.stopped event.",
    )


# --- the run admin -----------------------------------------------------------------------------


class RunAttemptInline(admin.TabularInline):
    """Read-only: attempts are opened and closed by workers, through the services."""

    model = RunAttempt
    verbose_name = "attempt"
    verbose_name_plural = "attempts"
    extra = 0
    max_num = 0
    can_delete = False
    ordering = ("generation",)
    fields = (
        "generation",
        "worker",
        "claimed",
        "heartbeat",
        "lease_expires",
        "released",
        "outcome_label",
        "stop_latency",
    )
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Whoever may see the run sees its attempts; they have no permissions of their own.
        return request.user.has_perm("runs.view_run") or request.user.has_perm("runs.change_run")

    @admin.display(description="claimed")
    def claimed(self, attempt: RunAttempt) -> str:
        return moment(attempt.claimed_at)

    @admin.display(description="last heartbeat")
    def heartbeat(self, attempt: RunAttempt) -> str:
        return moment(attempt.heartbeat_at)

    @admin.display(description="lease expires")
    def lease_expires(self, attempt: RunAttempt) -> str:
        return moment(attempt.lease_expires_at)

    @admin.display(description="released")
    def released(self, attempt: RunAttempt) -> str:
        return moment(attempt.released_at)

    @admin.display(description="outcome")
    def outcome_label(self, attempt: RunAttempt) -> str:
        return attempt.get_outcome_display()

    @admin.display(description="cancel → released")
    def stop_latency(self, attempt: RunAttempt) -> str:
        """How long the worker kept executing after the run was cancelled or stopped under it."""
        run = attempt.run  # the formset hands each attempt the page's run: no query
        if run.ended_at is None or run.status not in (Status.CANCELLED, Status.STOPPED):
            return "—"
        if attempt.outcome != run.status:
            return "—"  # the run ended while another attempt (or none) held it
        if attempt.released_at is None:
            return "not released yet"
        return f"{(attempt.released_at - run.ended_at).total_seconds():.3f} s"


class RunChangeList(ChangeList):
    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Run]:
        # The list shows none of the JSON documents; a page of runs should not carry them.
        return super().get_queryset(request, exclude_parameters).defer("input", "output", "error")


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = (
        "short_id",
        "agent",
        "owner",
        "status_badge",
        "created",
        "duration",
        "last_seq",
        "attempt_generation",
        "heartbeat",
        "end_code_label",
    )
    list_display_links = ("short_id",)
    list_filter = (
        "status",
        AgentFilter,
        OwnerFilter,
        "created_at",
        HasParentFilter,
        HeartbeatFilter,
        RunningForFilter,
    )
    search_fields = ("owner__username",)  # and ids, in get_search_results
    search_help_text = "A run id (whole, or its first characters) or an owner's username."
    ordering = ("-created_at",)
    list_per_page = 50
    # Counting every run on each page load is the one cost that grows with the table.
    show_full_result_count = False
    actions = ("cancel_selected", "stop_selected")
    change_form_template = "admin/runs/run/change_form.html"
    inlines = (RunAttemptInline,)
    fieldsets = (
        (None, {"fields": ("id", "agent", "owner", "status_label", "parent_link")}),
        ("Timing (UTC)", {"fields": ("created", "started", "ended", "duration", "deadline_at")}),
        ("End", {"fields": ("end_code", "end_reason", "ended_by")}),
        (
            "Execution",
            {
                "fields": (
                    "generation",
                    "last_seq",
                    "attempts_budget",
                    "steps_budget",
                    "events_budget",
                    "pause_requested",
                    "holds_resume_ticket",
                )
            },
        ),
        ("Input and result", {"fields": ("input_json", "output_json", "error_json")}),
    )
    readonly_fields = flatten_fieldsets(fieldsets)

    class Media:
        css = {"all": ("runs/admin.css",)}

    # --- nothing can be added, edited or deleted ---

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # View-only everywhere: the change form renders read-only and refuses POSTs. runs.change_run
        # still lets its holder view (Django's has_view_permission accepts it).
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("runs.cancel_run")

    def has_stop_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("runs.stop_run")

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    # --- list ---

    def get_queryset(self, request: HttpRequest) -> QuerySet[Run]:
        return selectors.run_admin_list().order_by(*(self.get_ordering(request) or ()))

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return RunChangeList

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Run], search_term: str
    ) -> tuple[QuerySet[Run], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        match = Q(owner__username__icontains=term)
        try:
            match |= Q(pk=UUID(term))
        except ValueError:
            # The list shows the first 8 characters of an id; they are enough to find it.
            if re.fullmatch(r"[0-9a-fA-F-]{4,36}", term):
                match |= Q(id__startswith=term.lower())
        return queryset.filter(match), False

    @admin.display(description="id", ordering="id")
    def short_id(self, run: Run) -> SafeString:
        return format_html('<span title="{}">{}</span>', run.pk, _short(run.pk))

    @admin.display(description="status", ordering="status")
    def status_badge(self, run: Run) -> SafeString:
        return status_badge(run.status)

    @admin.display(description="created (UTC)", ordering="created_at")
    def created(self, run: Run) -> str:
        return moment(run.created_at)

    @admin.display(description="started")
    def started(self, run: Run) -> str:
        return moment(run.started_at)

    @admin.display(description="ended")
    def ended(self, run: Run) -> str:
        return moment(run.ended_at)

    @admin.display(description="deadline")
    def deadline_at(self, run: Run) -> str:
        return moment(run.deadline)

    @admin.display(description="pause requested")
    def pause_requested(self, run: Run) -> str:
        return moment(run.pause_requested_at)

    @admin.display(description="duration")
    def duration(self, run: Run) -> str:
        """From the first start to the end (or now): how long it has been executing or waiting."""
        if run.started_at is None:
            return "—"
        return format_duration((run.ended_at or timezone.now()) - run.started_at)

    @admin.display(description="attempt", ordering="generation")
    def attempt_generation(self, run: Run) -> int:
        return run.generation

    @admin.display(description="heartbeat", ordering="current_heartbeat_at")
    def heartbeat(self, run: Run) -> SafeString | str:
        beat: datetime | None = getattr(run, "current_heartbeat_at", None)
        if beat is None:
            return "—"
        age = timezone.now() - beat
        # Red: a running run whose worker has been silent for a whole lease (see HeartbeatFilter).
        stale = run.status == Status.RUNNING and age.total_seconds() > settings.RUNLEDGER_LEASE_SECONDS
        css = "rl-stale" if stale else "rl-muted"
        return format_html('<span class="{}" title="{}">{} ago</span>', css, moment(beat), format_duration(age))

    @admin.display(description="end code", ordering="end_code", empty_value="—")
    def end_code_label(self, run: Run) -> str | None:
        return run.end_code or None

    # --- run page fields ---

    @admin.display(description="status")
    def status_label(self, run: Run) -> SafeString:
        return status_badge(run.status, live=not run.is_terminal)

    @admin.display(description="parent")
    def parent_link(self, run: Run) -> SafeString | str:
        if run.parent_id is None:
            return "—"
        url = reverse("admin:runs_run_change", args=[quote(run.parent_id)])
        return format_html('<a href="{}">{}</a>', url, run.parent_id)

    @admin.display(description="attempts lost / max")
    def attempts_budget(self, run: Run) -> str:
        return f"{run.lost_attempts} / {run.max_attempts}"

    @admin.display(description="steps used / max")
    def steps_budget(self, run: Run) -> str:
        return f"{run.steps_used} / {run.max_steps if run.max_steps is not None else '∞'}"

    @admin.display(description="events used / max")
    def events_budget(self, run: Run) -> str:
        return f"{run.events_used} / {run.max_events if run.max_events is not None else '∞'}"

    @admin.display(description="holds a resume ticket", boolean=True)
    def holds_resume_ticket(self, run: Run) -> bool:
        # The ticket itself is for the owner and runs.change_run holders, through the API.
        return bool(run.resume_ticket)

    @admin.display(description="input")
    def input_json(self, run: Run) -> SafeString:
        return pretty_json(run.input)

    @admin.display(description="output")
    def output_json(self, run: Run) -> SafeString:
        return pretty_json(run.output)

    @admin.display(description="error")
    def error_json(self, run: Run) -> SafeString:
        return pretty_json(run.error)

    # --- run page: timeline, children, live tail, command buttons ---

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Run | None = None,
    ) -> HttpResponse:
        if obj is not None:
            context.update(self._run_page_context(request, obj))
        return super().render_change_form(request, context, add=add, change=change, form_url=form_url, obj=obj)

    def _run_page_context(self, request: HttpRequest, run: Run) -> dict[str, Any]:
        pages = max(1, ceil(run.last_seq / EVENTS_PER_PAGE))
        try:
            page = int(request.GET.get("events_page", pages))
        except ValueError:
            page = pages
        page = min(max(page, 1), pages)
        first = (page - 1) * EVENTS_PER_PAGE + 1
        events = selectors.run_events_seq_range(run_id=run.pk, first_seq=first, last_seq=page * EVENTS_PER_PAGE)
        child_count, children = selectors.run_children_page(run_id=run.pk, limit=CHILDREN_SHOWN)
        live = not run.is_terminal
        info = self.opts.app_label, self.opts.model_name
        return {
            "run_page": True,
            "run_live": live,
            "event_rows": [self._event_row(event) for event in events],
            "events_page": page,
            "events_pages": pages,
            "events_page_links": {
                "first": 1 if page > 1 else None,
                "previous": page - 1 if page > 1 else None,
                "next": page + 1 if page < pages else None,
                "last": pages if page < pages else None,
            },
            "children": [(child, status_badge(child.status), moment(child.created_at)) for child in children],
            "child_count": child_count,
            "children_url": reverse(f"admin:{info[0]}_{info[1]}_changelist") + f"?parent={run.pk}",
            # The tail appends below the newest events, so it runs on the last page only.
            "tail": live and page == pages and not (events and events[-1].type in _TERMINAL_EVENT_TYPES),
            "tail_after_seq": events[-1].seq if events else first - 1,
            "tail_stream_url": reverse("run-stream", kwargs={"run_id": str(run.pk)}),
            "tail_events_url": reverse(f"admin:{info[0]}_{info[1]}_events", args=[quote(run.pk)]),
            "tail_event_types": json.dumps(EVENT_TYPES),
            "event_vocabulary": browser_vocabulary(),
            "can_cancel": live and self.has_cancel_permission(request),
            "can_stop": live and self.has_stop_permission(request),
            "cancel_url": reverse(f"admin:{info[0]}_{info[1]}_cancel", args=[quote(run.pk)]),
            "stop_url": reverse(f"admin:{info[0]}_{info[1]}_stop", args=[quote(run.pk)]),
        }

    @staticmethod
    def _event_row(event: RunEvent) -> dict[str, Any]:
        return {
            "seq": event.seq,
            "type": event.type,
            "time": event_time(event.created_at),
            "attempt": event.attempt,
            "summary": event_summary(event.data),
        }

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        wrap = self.admin_site.admin_view  # login, staff, CSRF protection, never cached
        return [
            path("<path:object_id>/cancel/", wrap(self.cancel_view), name=f"{info[0]}_{info[1]}_cancel"),
            path("<path:object_id>/stop/", wrap(self.stop_view), name=f"{info[0]}_{info[1]}_stop"),
            path("<path:object_id>/events/", wrap(self.events_view), name=f"{info[0]}_{info[1]}_events"),
            *super().get_urls(),
        ]

    def _visible_run(self, request: HttpRequest, object_id: str) -> Run:
        run = self.get_object(request, unquote(object_id))
        if run is None or not self.has_view_permission(request, run):
            raise Http404("run not found")
        return run

    def events_view(self, request: HttpRequest, object_id: str) -> JsonResponse:
        """Events after `after_seq` as JSON, for the live tail to fill a gap in what it received."""
        run = self._visible_run(request, object_id)
        raw = request.GET.get("after_seq", "0")
        if not raw.isdigit():
            return JsonResponse({"error": "after_seq must be an integer >= 0"}, status=400)
        events = selectors.run_events_after(run_id=run.pk, after_seq=int(raw), limit=EVENTS_JSON_LIMIT)
        return JsonResponse(
            {
                "results": [{**event.as_dict(), "time": event_time(event.created_at)} for event in events],
                "last_seq": run.last_seq,
            }
        )

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self._visible_run(request, object_id)
        if not self.has_cancel_permission(request):
            raise PermissionDenied
        return self._single_command(request, run, "cancel")

    def stop_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self._visible_run(request, object_id)
        if not self.has_stop_permission(request):
            raise PermissionDenied
        return self._single_command(request, run, "stop")

    def _single_command(self, request: HttpRequest, run: Run, kind: str) -> HttpResponse:
        # A GET (or a POST without the confirmation) only shows the confirmation page.
        form = self._command_form(request, kind)
        if form.is_bound and form.is_valid():
            outcome = self._execute(request, run.pk, kind, form.cleaned_data)
            level = messages.WARNING if outcome.startswith(("ended:", "gone")) else messages.SUCCESS
            self.message_user(request, f"Run {_short(run.pk)} {_phrase(kind, outcome, 1)}.", level)
            return HttpResponseRedirect(reverse("admin:runs_run_change", args=[quote(run.pk)]))
        back_url = reverse("admin:runs_run_change", args=[quote(run.pk)])
        return self._confirmation(request, kind, Run.objects.filter(pk=run.pk), form, back_url=back_url)

    # --- actions ---

    @admin.action(permissions=["cancel"], description="Cancel selected runs")
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Run]) -> HttpResponse | None:
        return self._bulk_command(request, queryset, "cancel")

    @admin.action(permissions=["stop"], description="Stop selected runs")
    def stop_selected(self, request: HttpRequest, queryset: QuerySet[Run]) -> HttpResponse | None:
        return self._bulk_command(request, queryset, "stop")

    def _bulk_command(self, request: HttpRequest, queryset: QuerySet[Run], kind: str) -> HttpResponse | None:
        allowed = self.has_cancel_permission(request) if kind == "cancel" else self.has_stop_permission(request)
        if not allowed:
            raise PermissionDenied
        total = queryset.count()
        if total > MAX_BULK_RUNS:
            self.message_user(
                request,
                f"{total} runs selected; a command takes at most {MAX_BULK_RUNS} at a time. Narrow the filter.",
                messages.ERROR,
            )
            return None
        form = self._command_form(request, kind)
        if form.is_bound and form.is_valid():
            ids = list(queryset.order_by("created_at", "id").values_list("pk", flat=True))
            outcomes = Counter(self._execute(request, run_id, kind, form.cleaned_data) for run_id in ids)
            self._report(request, kind, outcomes)
            return None  # back to the list
        return self._confirmation(request, kind, queryset, form, back_url=request.get_full_path())

    @staticmethod
    def _command_form(request: HttpRequest, kind: str) -> forms.Form:
        form_class = CancelForm if kind == "cancel" else StopForm
        # Bound only on the confirmation page's own POST (post=yes): the first POST of an action,
        # from the list, and every GET just show the page.
        if request.method == "POST" and request.POST.get("post") == "yes":
            return form_class(request.POST)
        return form_class()

    def _execute(self, request: HttpRequest, run_id: UUID, kind: str, data: dict[str, Any]) -> str:
        """Run one command through the services; the outcome is a key for `_phrase`."""
        actor = _actor(request)
        try:
            if kind == "cancel":
                result = services.run_cancel(run_id=run_id, actor=actor, note=data["note"])
            else:
                result = services.run_stop(run_id=run_id, actor=actor, code=data["code"], reason=data["reason"])
        except NotFound:
            return "gone"
        except RunConflict as exc:
            return f"ended:{exc.run.status if exc.run is not None else 'unknown'}"
        if not result.changed:
            return "already"
        if kind == "cancel":
            self.log_change(request, result.run, f"Cancelled: {data['note']}" if data["note"] else "Cancelled")
        else:
            self.log_change(request, result.run, f"Stopped ({data['code']}): {data['reason']}")
        return "done"

    def _report(self, request: HttpRequest, kind: str, outcomes: Counter[str]) -> None:
        order = ["done", "already", *(f"ended:{status}" for status in _ENDED_PHRASE)]
        keys = order + sorted(key for key in outcomes if key not in order)
        parts = [f"{outcomes[key]} {_phrase(kind, key, outcomes[key])}" for key in keys if outcomes[key]]
        trouble = any(key.startswith(("ended:", "gone")) for key in outcomes)
        self.message_user(request, ", ".join(parts) + ".", messages.WARNING if trouble else messages.SUCCESS)

    def _confirmation(
        self, request: HttpRequest, kind: str, runs: QuerySet[Run], form: forms.Form, *, back_url: str
    ) -> TemplateResponse:
        total = runs.count()
        sample = list(runs.select_related("owner").order_by("created_at", "id")[:CONFIRMATION_SAMPLE])
        live = runs.exclude(status__in=[status.value for status in TERMINAL]).count()
        select_across = request.POST.get("select_across") == "1"
        # With "select all", the hidden ids are only a token (Django wants one); the list's filters,
        # kept in the URL this page posts back to, define the selection again.
        selected = [run.pk for run in sample] if select_across else list(runs.values_list("pk", flat=True))
        verb = "cancel" if kind == "cancel" else "stop"
        action = request.POST.get("action") if request.method == "POST" else None
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"{verb.capitalize()} {'this run' if action is None else 'runs'}",
            "kind": kind,
            "verb": verb,
            "done": "cancelled" if kind == "cancel" else "stopped",
            "form": form,
            "runs": [(run, status_badge(run.status), moment(run.created_at)) for run in sample],
            "total": total,
            "more": total - len(sample),
            "live": live,
            "ended": total - live,
            "action": action,
            "selected": selected,
            "select_across": select_across,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "back_url": back_url,
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/runs/run/command_confirmation.html", context)


def _phrase(kind: str, outcome: str, count: int) -> str:
    done = "cancelled" if kind == "cancel" else "stopped"
    if outcome == "done":
        return done
    if outcome == "already":
        return f"{'was' if count == 1 else 'were'} already {done}"
    if outcome == "gone":
        return "no longer existed"
    status = outcome.removeprefix("ended:")
    return _ENDED_PHRASE.get(status, f"could not be {done} (it is {status})")
