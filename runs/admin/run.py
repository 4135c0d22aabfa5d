"""The staff console's run admin (docs/design/commands.md): find runs, inspect them, watch them live,
send them commands. Thin: every change is a command of `runs.services` behind its permission, a
confirmation page and a CSRF-protected POST (`runs.admin.commands`); the change form is view-only."""

import re
from datetime import datetime
from math import ceil
from typing import Any
from uuid import UUID

from django.contrib import admin
from django.contrib.admin.utils import flatten_fieldsets, quote, unquote
from django.contrib.admin.views.main import ChangeList
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from runs import selectors
from runs.access import sees_every_run
from runs.admin.commands import COMMANDS, bulk_action
from runs.admin.display import (
    event_summary,
    event_time,
    format_duration,
    json_field,
    moment,
    moment_field,
    run_link,
    short_id,
    status_badge,
)
from runs.admin.filters import (
    AgentFilter,
    HasParentFilter,
    HeartbeatFilter,
    OwnerFilter,
    RunningForFilter,
    metadata_search,
)
from runs.admin.hardening import HardenedAdmin, HardenedChangeList
from runs.admin.matching import MatchingMixin
from runs.admin.priority import PriorityMixin, priority_buttons
from runs.admin.rerun import RerunMixin
from runs.admin.results import ResultsMixin
from runs.conf import conf
from runs.events import TERMINAL_EVENT_TYPES
from runs.models import AttemptOutcome, Run, RunAttempt, RunEvent
from runs.transitions import Status

EVENTS_PER_PAGE = 100
CHILDREN_SHOWN = 20


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

    claimed = moment_field("claimed_at", "claimed")
    heartbeat = moment_field("heartbeat_at", "last heartbeat")
    lease_expires = moment_field("lease_expires_at", "lease expires")
    released = moment_field("released_at", "released")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Whoever may see the run sees its attempts; they have no permissions of their own.
        return sees_every_run(request.user)

    @admin.display(description="outcome")
    def outcome_label(self, attempt: RunAttempt) -> str:
        return attempt.get_outcome_display()

    @admin.display(description="cancel → released")
    def stop_latency(self, attempt: RunAttempt) -> str:
        """How long the worker kept executing after the run was cancelled or stopped under it."""
        run = attempt.run  # the formset hands each attempt the page's run: no query
        if run.ended_at is None or run.status not in (Status.CANCELLED, Status.STOPPED):
            return "—"
        # A lost attempt held the run when it ended if it is the run's last; its worker never said
        # it stopped, and the sweeper released it when its lease lapsed.
        lost = attempt.outcome == AttemptOutcome.LOST and attempt.generation == run.generation
        if attempt.outcome != run.status and not lost:
            return "—"  # the run ended while another attempt (or none) held it
        if attempt.released_at is None:
            return f"not released yet (lease lapses {moment(attempt.lease_expires_at)})"
        latency = f"{(attempt.released_at - run.ended_at).total_seconds():.3f} s"
        return f"{latency} (worker lost: its lease lapsed)" if lost else latency


class RunChangeList(HardenedChangeList):
    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Run]:
        # The list shows none of the documents (JSON values up to the body limit each, a reason of up
        # to 10,000 characters, the open tool calls); a page of runs should not carry them.
        queryset = super().get_queryset(request, exclude_parameters)
        return queryset.defer("input", "output", "error", "end_reason", "open_tool_calls")


class ViewOnly:
    """Nothing can be added, edited or deleted: a change form renders read-only and refuses POSTs.
    runs.change_run still lets its holder view (Django's has_view_permission accepts it)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Run)
class RunAdmin(ViewOnly, MatchingMixin, RerunMixin, PriorityMixin, ResultsMixin, HardenedAdmin):
    list_display = (
        "short_id",
        "agent",
        "owner",
        "status_badge",
        "priority",
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
    # The run page's "all child runs" link (?parent=<id>); a malformed id is an invalid filter.
    # And its reruns' "all" link (?rerun_of=<id>), a schedule's "its runs" (?schedule=<id>).
    extra_lookups = ("parent", "rerun_of", "schedule")
    search_fields = ("owner__username",)  # and ids, in get_search_results
    search_help_text = "A run id (whole, or its first characters), an owner's username, or a metadata label key=value."
    ordering = ("-created_at",)
    list_per_page = 50
    # Counting every run on each page load is the one cost that grows with the table.
    show_full_result_count = False
    actions = tuple(bulk_action(command) for command in COMMANDS)
    change_form_template = "admin/runs/run/change_form.html"
    inlines = (RunAttemptInline,)
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "agent",
                    "owner",
                    "status_label",
                    "parent_link",
                    "rerun_of_link",
                    "reruns_links",
                    "schedule_link",
                    "metadata_json",
                )
            },
        ),
        ("Timing (UTC)", {"fields": ("created", "start_after_at", "started", "ended", "duration", "deadline_at")}),
        ("End", {"fields": ("end_code", "end_reason", "ended_by")}),
        (
            "Execution",
            {
                "fields": (
                    "priority",
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

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        for command in COMMANDS:
            if not command.allowed(request.user):
                actions.pop(command.action, None)
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
        if "=" in term:
            return metadata_search(queryset, term), False
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
        return format_html('<span title="{}">{}</span>', run.pk, short_id(run.pk))

    @admin.display(description="status", ordering="status")
    def status_badge(self, run: Run) -> SafeString:
        return status_badge(run.status)

    created = moment_field("created_at", "created (UTC)", ordering="created_at")
    started = moment_field("started_at", "started")
    ended = moment_field("ended_at", "ended")
    deadline_at = moment_field("deadline", "deadline")
    start_after_at = moment_field("start_after", "start after")
    pause_requested = moment_field("pause_requested_at", "pause requested")

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
        stale = run.status == Status.RUNNING and age.total_seconds() > conf.LEASE_SECONDS
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
        return run_link(run.parent_id)

    @admin.display(description="schedule")
    def schedule_link(self, run: Run) -> SafeString | str:
        if run.schedule_id is None:
            return "—"
        url = reverse("admin:runs_schedule_change", args=[quote(run.schedule_id)])
        return format_html('<a href="{}">{}</a>, due {}', url, run.schedule_id, moment(run.schedule_due_at))

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

    metadata_json = json_field("metadata", "metadata")
    input_json = json_field("input", "input")

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
            "tail": live and page == pages and not (events and events[-1].type in TERMINAL_EVENT_TYPES),
            "tail_after_seq": events[-1].seq if events else first - 1,
            "tail_stream_url": reverse("runs:run-stream", kwargs={"run_id": str(run.pk)}),
            "commands": [
                {
                    "name": command.name,
                    "label": f"{command.name.capitalize()} run",
                    "url": reverse(f"admin:{info[0]}_{info[1]}_{command.name}", args=[quote(run.pk)]),
                }
                for command in COMMANDS
                if live and command.allowed(request.user)
            ]
            + priority_buttons(request.user, run),
            "rerun": self.rerun_button(request, run),
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
            *(
                path(
                    f"<path:object_id>/{command.name}/",
                    wrap(self.command_view),
                    {"command": command.name},
                    name=f"{info[0]}_{info[1]}_{command.name}",
                )
                for command in COMMANDS
            ),
            *self.matching_urls(),
            path("<path:object_id>/rerun/", wrap(self.rerun_view), name=f"{info[0]}_{info[1]}_rerun"),
            path("<path:object_id>/priority/", wrap(self.priority_view), name=f"{info[0]}_{info[1]}_priority"),
            *super().get_urls(),
        ]

    def visible_run(self, request: HttpRequest, object_id: str) -> Run:
        run = self.get_object(request, unquote(object_id))
        if run is None or not self.has_view_permission(request, run):
            raise Http404("run not found")
        return run

    def rerun_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self.rerun_page(request, self.visible_run(request, object_id))

    def command_view(self, request: HttpRequest, object_id: str, command: str) -> HttpResponse:
        run = self.visible_run(request, object_id)
        return self.single_command(request, run, next(c for c in COMMANDS if c.name == command))
