"""The staff console's commands as a table (docs/design/commands.md): one `StaffCommand` per command,
and the views that confirm and run any of them, on one run or on a selection. A command is the same
service as the API's, one locked transaction per run; the console adds a permission, a form, a
confirmation page and a report of what happened to each run."""

import enum
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from runs import services
from runs.access import AnyUser, User
from runs.admin.display import moment, short_id, status_badge
from runs.exceptions import NotFound, RunConflict
from runs.models import Run
from runs.services import MAX_BULK_RUNS
from runs.transitions import CALLER_STOP_CODES, TERMINAL, Status, StopCode

CONFIRMATION_SAMPLE = 20


class CancelForm(forms.Form):
    note = forms.CharField(
        required=False,
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text="Optional. Recorded as the run's end reason and in its run.cancelled event.",
    )


class StopForm(forms.Form):
    code = forms.ChoiceField(
        label="Stop code",
        choices=[(code.value, code.value) for code in StopCode if code in CALLER_STOP_CODES],
        initial=StopCode.STAFF.value,
    )
    reason = forms.CharField(
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text="Required. Recorded as the run's end reason and in its run.stopped event.",
    )


@dataclass(frozen=True)
class StaffCommand:
    # The URL segment (…/<run id>/<name>/), the action `<name>_selected`, the route `runs_run_<name>`.
    name: str
    # The status the command ends a live run in.
    target: Status
    permission: str
    form: type[forms.Form]
    # The service, called with the run, the staff member and the form's cleaned data.
    execute: Callable[[UUID, User, dict[str, Any]], services.CommandResult]
    # What the admin's history records about the run.
    history: Callable[[dict[str, Any]], str]

    @property
    def action(self) -> str:
        return f"{self.name}_selected"

    def allowed(self, user: AnyUser) -> bool:
        return user.has_perm(self.permission)


COMMANDS: tuple[StaffCommand, ...] = (
    StaffCommand(
        name="cancel",
        target=Status.CANCELLED,
        permission="runs.cancel_run",
        form=CancelForm,
        execute=lambda run_id, actor, data: services.run_cancel(run_id=run_id, actor=actor, note=data["note"]),
        history=lambda data: f"Cancelled: {data['note']}" if data["note"] else "Cancelled",
    ),
    StaffCommand(
        name="stop",
        target=Status.STOPPED,
        permission="runs.stop_run",
        form=StopForm,
        execute=lambda run_id, actor, data: services.run_stop(
            run_id=run_id, actor=actor, code=data["code"], reason=data["reason"]
        ),
        history=lambda data: f"Stopped ({data['code']}): {data['reason']}",
    ),
)


class Result(enum.Enum):
    DONE = "done"
    ALREADY = "already"
    # The run no longer exists.
    GONE = "gone"
    # The run had ended otherwise; `Outcome.status` says how.
    ENDED = "ended"


@dataclass(frozen=True)
class Outcome:
    result: Result
    status: str = ""

    @property
    def trouble(self) -> bool:
        return self.result in (Result.GONE, Result.ENDED)

    def phrase(self, command: StaffCommand, count: int) -> str:
        done = command.target.value
        if self.result is Result.DONE:
            return done
        if self.result is Result.ALREADY:
            return f"{'was' if count == 1 else 'were'} already {done}"
        if self.result is Result.GONE:
            return "no longer existed"
        return _ENDED_PHRASE.get(self.status, f"could not be {done} (it is {self.status})")


_ENDED_PHRASE: dict[str, str] = {
    Status.COMPLETED: "had already completed",
    Status.FAILED: "had already failed",
    Status.CANCELLED: "had already been cancelled",
    Status.STOPPED: "had already been stopped",
}

# How a report lists the outcomes of a bulk command; any other comes after these.
_REPORT_ORDER = [Outcome(Result.DONE), Outcome(Result.ALREADY), *(Outcome(Result.ENDED, s) for s in _ENDED_PHRASE)]


def _actor(request: HttpRequest) -> User:
    user = request.user
    if not isinstance(user, User):
        raise PermissionDenied
    return user


class CommandsMixin(admin.ModelAdmin):
    """The run admin's command views: `command_view` for one run, `bulk_command` for the actions."""

    def run_command(self, request: HttpRequest, run_id: UUID, command: StaffCommand, data: dict[str, Any]) -> Outcome:
        try:
            result = command.execute(run_id, _actor(request), data)
        except NotFound:
            return Outcome(Result.GONE)
        except RunConflict as exc:
            return Outcome(Result.ENDED, exc.run.status if isinstance(exc.run, Run) else "unknown")
        if not result.changed:
            return Outcome(Result.ALREADY)
        self.log_change(request, result.run, command.history(data))
        return Outcome(Result.DONE)

    def single_command(self, request: HttpRequest, run: Run, command: StaffCommand) -> HttpResponse:
        if not command.allowed(request.user):
            raise PermissionDenied
        # A GET (or a POST without the confirmation) only shows the confirmation page.
        form = _command_form(request, command)
        back_url = reverse("admin:runs_run_change", args=[quote(run.pk)])
        if form.is_bound and form.is_valid():
            outcome = self.run_command(request, run.pk, command, form.cleaned_data)
            level = messages.WARNING if outcome.trouble else messages.SUCCESS
            self.message_user(request, f"Run {short_id(run.pk)} {outcome.phrase(command, 1)}.", level)
            return HttpResponseRedirect(back_url)
        return self._confirmation(request, command, Run.objects.filter(pk=run.pk), form, back_url=back_url)

    def bulk_command(
        self,
        request: HttpRequest,
        queryset: QuerySet[Run],
        command: StaffCommand,
        *,
        matching: bool = False,
        back_url: str | None = None,
    ) -> HttpResponse | None:
        """The confirmation page, then (its POST) the command on each of `queryset`. `matching`:
        the list's "all that match" button (runs.admin.matching), whose page posts back the count
        it showed as `max`; more matches by then refuse it all."""
        if not command.allowed(request.user):
            raise PermissionDenied
        total = queryset.count()
        if total > MAX_BULK_RUNS:
            self.message_user(
                request,
                f"{total} runs selected; a command takes at most {MAX_BULK_RUNS} at a time. Narrow the filter.",
                messages.ERROR,
            )
            return None
        form = _command_form(request, command)
        if form.is_bound and form.is_valid():
            confirmed = request.POST.get("max")
            if confirmed is not None and (not confirmed.isdigit() or total > int(confirmed)):
                self.message_user(
                    request,
                    f"{total} runs match now, more than the {confirmed} you confirmed: nothing was done.",
                    messages.ERROR,
                )
                return None
            ids = list(queryset.order_by("created_at", "id").values_list("pk", flat=True))
            outcomes = Counter(self.run_command(request, run_id, command, form.cleaned_data) for run_id in ids)
            self._report(request, command, outcomes)
            return None  # back to the list
        return self._confirmation(
            request, command, queryset, form, back_url=back_url or request.get_full_path(), matching=matching
        )

    def _report(self, request: HttpRequest, command: StaffCommand, outcomes: Counter[Outcome]) -> None:
        rest = sorted((o for o in outcomes if o not in _REPORT_ORDER), key=lambda o: (o.result.value, o.status))
        parts = [f"{outcomes[o]} {o.phrase(command, outcomes[o])}" for o in [*_REPORT_ORDER, *rest] if outcomes[o]]
        trouble = any(outcome.trouble for outcome in outcomes)
        self.message_user(request, ", ".join(parts) + ".", messages.WARNING if trouble else messages.SUCCESS)

    def _confirmation(
        self,
        request: HttpRequest,
        command: StaffCommand,
        runs: QuerySet[Run],
        form: forms.Form,
        *,
        back_url: str,
        matching: bool = False,
    ) -> TemplateResponse:
        total = runs.count()
        sample = list(runs.select_related("owner").order_by("created_at", "id")[:CONFIRMATION_SAMPLE])
        live = runs.exclude(status__in=[status.value for status in TERMINAL]).count()
        select_across = request.POST.get("select_across") == "1"
        # With "select all", the hidden ids are only a token (Django wants one); the list's filters,
        # kept in the URL this page posts back to, define the selection again.
        selected = [run.pk for run in sample] if select_across else list(runs.values_list("pk", flat=True))
        action = request.POST.get("action") if request.method == "POST" else None
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"{command.name.capitalize()} "
            + ("every run that matches" if matching else "this run" if action is None else "runs"),
            # The "all that match" page: the count shown, posted back as the most to command.
            "max": total if matching else None,
            "verb": command.name,
            "done": command.target.value,
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


def _command_form(request: HttpRequest, command: StaffCommand) -> forms.Form:
    # Bound only on the confirmation page's own POST (post=yes): the first POST of an action,
    # from the list, and every GET just show the page.
    if request.method == "POST" and request.POST.get("post") == "yes":
        return command.form(request.POST)
    return command.form()


def bulk_action(command: StaffCommand) -> Callable[..., HttpResponse | None]:
    """The list action of `command` (`<name>_selected`); `RunAdmin.get_actions` offers it only to
    those the command allows."""

    def action(modeladmin: CommandsMixin, request: HttpRequest, queryset: QuerySet[Run]) -> HttpResponse | None:
        return modeladmin.bulk_command(request, queryset, command)

    action.__name__ = command.action
    return admin.action(description=f"{command.name.capitalize()} selected runs")(action)
