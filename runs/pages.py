"""The end-user pages (docs/design/clients.md#watch-page): the list of one's runs with a "start a demo
run" form (when the `demo` agent is registered), and the watch page, a plain template whose script
(runs/static/runs/watch.js) knows of a run only what the SSE stream and the REST API tell it."""

from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AbstractBaseUser
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from runs import selectors, services
from runs.agents import declared_types, is_registered
from runs.events import browser_vocabulary
from runs.exceptions import NotFound, RunledgerError


class DemoRunForm(forms.Form):
    deltas = forms.IntegerField(min_value=1, max_value=10_000, initial=40)
    delay_ms = forms.IntegerField(min_value=0, max_value=10_000, initial=100, label="Delay (ms)")
    tool = forms.ChoiceField(
        choices=[
            ("", "none"),
            ("slow", "slow (honours cancel)"),
            ("stubborn", "stubborn (ignores cancel)"),
            ("process", "process (a child process)"),
            ("blocking", "blocking (code in a thread)"),
        ],
        required=False,
    )
    ask = forms.CharField(max_length=200, required=False, label="Ask for input (prompt)")
    children = forms.IntegerField(min_value=0, max_value=10, initial=0)

    def demo_input(self) -> dict[str, Any]:
        data = self.cleaned_data
        return {
            "deltas": data["deltas"],
            "delay_ms": data["delay_ms"],
            "tool": data["tool"] or None,
            "ask": data["ask"] or None,
            "children": data["children"],
        }


@login_required
@require_http_methods(["GET", "POST"])
def run_list_page(request: HttpRequest) -> HttpResponse:
    # Asked at each request: the registry is filled as Django starts (RUNLEDGER_AGENTS), which may
    # be after this module is imported.
    form = DemoRunForm(request.POST or None) if is_registered("demo") else None
    if request.method == "POST" and form is None:
        return HttpResponseNotAllowed(["GET"])
    if request.method == "POST" and form is not None and form.is_valid():
        assert isinstance(request.user, AbstractBaseUser)  # login_required
        try:
            run = services.run_create(owner=request.user, agent="demo", input=form.demo_input())
        except RunledgerError as exc:
            form.add_error(None, exc.message)
        else:
            return redirect("runs:run-watch", run_id=run.pk)
    runs = selectors.run_list(user=request.user).filter(owner_id=request.user.pk)
    page = Paginator(runs, 25).get_page(request.GET.get("page"))
    return render(request, "runs/run_list.html", {"form": form, "page": page})


@login_required
@require_http_methods(["GET"])
def run_watch_page(request: HttpRequest, run_id: str) -> HttpResponse:
    try:
        run = selectors.run_get(run_id=run_id, user=request.user)
    except NotFound as exc:
        raise Http404(exc.message) from exc
    return render(
        request, "runs/run_watch.html", {"run": run, "event_vocabulary": browser_vocabulary(declared_types(run.agent))}
    )
