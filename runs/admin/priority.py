"""The run page's "Priority and start" command (docs/design/fair-use.md#priority): a queued run's
priority and start time, changed by staff who hold `runs.prioritize_run` through the same service as
any command (`services.run_schedule`, one locked transaction), with a form and a report. Not a
schedule (runs.admin.schedules): one run's place in the queue."""

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from runs import services
from runs.access import AnyUser, User
from runs.admin.display import run_form_page, short_id
from runs.exceptions import NotFound, RunConflict, ValidationFailed
from runs.models import PRIORITY_MAX, PRIORITY_MIN, URGENT_MAX, Run
from runs.transitions import Status

PERMISSION = "runs.prioritize_run"


class PriorityForm(forms.Form):
    priority = forms.IntegerField(
        min_value=PRIORITY_MIN,
        max_value=URGENT_MAX,
        help_text=f"{PRIORITY_MIN}..{PRIORITY_MAX} orders the owner's own queued runs, higher first; above "
        f"{PRIORITY_MAX} the run is claimed before any other by fair share.",
    )
    start_after = forms.DateTimeField(
        required=False,
        label="Start after (UTC)",
        help_text="e.g. 2030-01-31 09:00:00. Empty: as soon as a worker has a slot for it.",
    )


def priority_buttons(user: AnyUser, run: Run) -> list[dict[str, str]]:
    """The run page's "Priority and start" button, for a queued run and a holder of the permission."""
    if run.status != Status.QUEUED or not user.has_perm(PERMISSION):
        return []
    url = reverse("admin:runs_run_priority", args=[quote(run.pk)])
    return [{"name": "priority", "label": "Priority and start", "url": url}]


class PriorityMixin(admin.ModelAdmin):
    """`priority_view`, for the run admin's URL `<id>/priority/`; the run admin finds the run."""

    def visible_run(self, request: HttpRequest, object_id: str) -> Run:
        raise NotImplementedError

    def priority_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self.visible_run(request, object_id)
        if not request.user.has_perm(PERMISSION) or not isinstance(request.user, User):
            raise PermissionDenied
        back_url = reverse("admin:runs_run_change", args=[quote(run.pk)])
        if run.status != Status.QUEUED:
            said = f"Run {short_id(run.pk)} is {run.status}: only a queued run takes a priority and a start time."
            self.message_user(request, said, messages.WARNING)
            return HttpResponseRedirect(back_url)
        initial = {"priority": run.priority, "start_after": run.start_after}
        form = PriorityForm(request.POST) if request.method == "POST" else PriorityForm(initial=initial)
        if form.is_bound and form.is_valid():
            data = form.cleaned_data
            try:
                result = services.run_schedule(
                    run_id=run.pk, actor=request.user, priority=data["priority"], start_after=data["start_after"]
                )
            except ValidationFailed as exc:
                form.add_error(None, exc.message)
            except (RunConflict, NotFound) as exc:
                self.message_user(request, f"Run {short_id(run.pk)} was not changed: {exc.message}.", messages.WARNING)
                return HttpResponseRedirect(back_url)
            else:
                said = f"priority {data['priority']}, start after {data['start_after'] or 'now'}"
                if result.changed:
                    self.log_change(request, result.run, f"Priority and start: {said}")
                self.message_user(request, f"Run {short_id(run.pk)}: {said}.", messages.SUCCESS)
                return HttpResponseRedirect(back_url)
        return run_form_page(
            self,
            request,
            "admin/runs/run/priority.html",
            title="Priority and start of this run",
            run=run,
            form=form,
            back_url=back_url,
        )
