"""The run page's "Rerun" button and the links between a run and its reruns
(docs/design/commands.md#rerun): the same service as the API's `POST …/rerun/`, behind the same
rule (the run's owner, or `runs.change_run`), a confirmation page and a CSRF-protected POST."""

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from runs import services
from runs.access import User, can_rerun
from runs.admin.display import run_form_page, run_link
from runs.exceptions import RunConflict, ValidationFailed
from runs.models import Run

# The reruns a run's page links to, newest first; the list (?rerun_of=) has them all.
RERUNS_SHOWN = 10


class RerunForm(forms.Form):
    from_seq = forms.IntegerField(
        required=False,
        min_value=1,
        label="Fork at seq",
        help_text="Optional. Continue from a copy of this run's agent events up to this seq; "
        "empty: run it again from the start.",
    )


class RerunMixin(admin.ModelAdmin):
    @admin.display(description="rerun of")
    def rerun_of_link(self, run: Run) -> SafeString | str:
        return run_link(run.rerun_of_id)

    @admin.display(description="reruns")
    def reruns_links(self, run: Run) -> SafeString | str:
        reruns = list(run.reruns.order_by("-created_at", "-id").values_list("pk", flat=True)[: RERUNS_SHOWN + 1])
        if not reruns:
            return "—"
        links = format_html_join(
            ", ",
            '<a href="{}">{}</a>',
            ((reverse("admin:runs_run_change", args=[quote(pk)]), str(pk)[:8]) for pk in reruns[:RERUNS_SHOWN]),
        )
        if len(reruns) > RERUNS_SHOWN:
            url = reverse("admin:runs_run_changelist") + f"?rerun_of={run.pk}"
            return format_html('{} <a href="{}">all</a>', links, url)
        return links

    def rerun_button(self, request: HttpRequest, run: Run) -> dict[str, str] | None:
        """The page's button: on an ended run, for those who may rerun it."""
        if not run.is_terminal or not can_rerun(request.user, run):
            return None
        return {"label": "Rerun…", "url": reverse("admin:runs_run_rerun", args=[quote(run.pk)])}

    def rerun_page(self, request: HttpRequest, run: Run) -> HttpResponse:
        user = request.user
        if not isinstance(user, User) or not can_rerun(user, run):
            raise PermissionDenied
        back_url = reverse("admin:runs_run_change", args=[quote(run.pk)])
        form = (
            RerunForm(request.POST) if request.method == "POST" and request.POST.get("post") == "yes" else RerunForm()
        )
        if form.is_bound and form.is_valid():
            try:
                new = services.run_rerun(run_id=run.pk, owner=user, from_seq=form.cleaned_data["from_seq"])
            except ValidationFailed as exc:
                form.add_error("from_seq", exc.message)
            except RunConflict:
                self.message_user(request, f"Run {str(run.pk)[:8]} has not ended: it cannot be rerun.", messages.ERROR)
                return HttpResponseRedirect(back_url)
            else:
                self.log_addition(request, new, f"Rerun of {run.pk}")
                self.message_user(request, f"Run {str(new.pk)[:8]} reruns run {str(run.pk)[:8]}.", messages.SUCCESS)
                return HttpResponseRedirect(reverse("admin:runs_run_change", args=[quote(new.pk)]))
        return run_form_page(
            self,
            request,
            "admin/runs/run/rerun_confirmation.html",
            title="Rerun this run",
            run=run,
            form=form,
            back_url=back_url,
        )
