"""Schedules in the console (docs/design/schedules.md#commands): each with its timing, its next due
time and its last run's status, a link to the runs it created, and "pause" and "resume" for staff
who may change runs — through the same services as the API. View only otherwise: a schedule is
created and changed by its owner, through the API. Seen by those who see every run."""

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from runs.access import User, sees_every_run
from runs.admin.display import json_field, moment_field, status_badge
from runs.admin.hardening import HardenedAdmin
from runs.admin.run import ViewOnly
from runs.exceptions import NotFound
from runs.models import Schedule
from runs.selectors.schedules import SCHEDULES_OF_ANYONE, with_owner_and_last_run
from runs.services.schedules import schedule_pause, schedule_resume

# The schedule's page: every fact, read only.
SHOWN = (
    "id",
    "agent",
    "owner",
    "timing",
    "timezone",
    "overlap",
    "catchup_window_seconds",
    "starts",
    "ends",
    "paused",
    "next_due",
    "last_run_status",
    "runs_link",
    "priority",
    "metadata_json",
    "input_json",
    "created",
)


def runs_url(schedule: Schedule) -> str:
    """The run list, of the runs `schedule` created."""
    return reverse("admin:runs_run_changelist") + f"?schedule={quote(schedule.pk)}"


@admin.register(Schedule)
class ScheduleAdmin(ViewOnly, HardenedAdmin):
    list_display = [
        "agent",
        "owner",
        "timing",
        "timezone",
        "paused",
        "next_due",
        "last_run_status",
        "runs_link",
    ]
    list_filter = ["paused", "overlap"]
    search_fields = ["agent", "owner__username"]
    # The same joins as get_queryset's (with_owner_and_last_run, which leaves the last run's heavy fields out).
    list_select_related = ["owner", "last_run"]
    ordering = ["-created_at"]
    actions = ["pause", "resume"]
    fields = SHOWN
    readonly_fields = SHOWN

    class Media:
        css = {"all": ("runs/admin.css",)}

    @admin.display(description="timing")
    def timing(self, schedule: Schedule) -> str:
        return f"cron {schedule.cron}" if schedule.cron else f"{schedule.every_seconds} s"

    next_due = moment_field("next_due_at", "next due (UTC)", ordering="next_due_at")
    starts = moment_field("start_at", "start at")
    ends = moment_field("end_at", "end at")
    created = moment_field("created_at", "created")
    input_json = json_field("input", "input")
    metadata_json = json_field("metadata", "metadata")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Schedule]:
        return with_owner_and_last_run(super().get_queryset(request))

    @admin.display(description="last run")
    def last_run_status(self, schedule: Schedule) -> SafeString | str:
        run = schedule.last_run
        if run is None:
            return "—"
        url = reverse("admin:runs_run_change", args=[quote(run.pk)])
        return format_html('<a href="{}" title="{}">{}</a>', url, run.pk, status_badge(run.status))

    @admin.display(description="runs")
    def runs_link(self, schedule: Schedule) -> SafeString:
        return format_html('<a href="{}" class="rl-schedule-runs">its runs</a>', runs_url(schedule))

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A schedule is what its runs are made of (their input, labels, priority): for those who
        # may see every run, as the run list and the dashboard, which links here.
        return sees_every_run(request.user)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_command_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(SCHEDULES_OF_ANYONE)

    @admin.action(description="Pause the selected schedules", permissions=["command"])
    def pause(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._each(request, queryset, schedule_pause, "paused")

    @admin.action(
        description="Resume the selected schedules (from their next due time after now)", permissions=["command"]
    )
    def resume(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._each(request, queryset, schedule_resume, "resumed")

    def _each(self, request: HttpRequest, queryset: QuerySet[Schedule], command: Any, done: str) -> None:
        """`command` on each selected schedule, one locked transaction each; one deleted meanwhile
        is said, not an error."""
        assert isinstance(request.user, User)
        count, gone = 0, 0
        for schedule_id in queryset.values_list("pk", flat=True):
            try:
                command(schedule_id=schedule_id, actor=request.user)
            except NotFound:
                gone += 1
            else:
                count += 1
        said = f"{count} schedule{'s' if count != 1 else ''} {done}."
        if gone:
            said += f" {gone} no longer exist{'s' if gone == 1 else ''}."
        self.message_user(request, said, messages.SUCCESS if not gone else messages.WARNING)
