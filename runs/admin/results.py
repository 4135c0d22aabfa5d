"""What the run page shows of what a run produced and used: its output and error (in the run
admin's "Input and result" fieldset), and a "Results" fieldset of its own with its usage and the
partial output of a run that ended other than completed (docs/design/execution.md#partial-output,
docs/design/events.md#usage) — the same reads as the run's JSON — and its durable steps with their
retries (docs/design/execution.md#steps)."""

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.safestring import SafeString

from runs.admin.display import json_field, pretty_json
from runs.models import Run
from runs.selectors.results import run_partial_output, run_steps, run_usage

RESULTS_FIELDS = ("usage_json", "partial_output_json", "steps_summary")


class ResultsMixin(admin.ModelAdmin):
    """Adds its fieldset after the run admin's own, read-only like them."""

    output_json = json_field("output", "output")
    error_json = json_field("error", "error")

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        return [*super().get_fieldsets(request, obj), ("Results", {"fields": RESULTS_FIELDS})]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return [*super().get_readonly_fields(request, obj), *RESULTS_FIELDS]

    @admin.display(description="usage")
    def usage_json(self, run: Run) -> SafeString:
        return pretty_json(run_usage(run=run))

    @admin.display(description="partial output")
    def partial_output_json(self, run: Run) -> SafeString | str:
        partial = run_partial_output(run=run)
        return "—" if partial is None else pretty_json(partial)

    @admin.display(description="durable steps")
    def steps_summary(self, run: Run) -> str:
        steps = run_steps(run=run)
        if not steps["completed"] and not steps["retries"]:
            return "—"
        retried = "; ".join(
            f"{name} retried {r['retries']} times (last: {r['last_error']})" for name, r in steps["retries"].items()
        )
        return f"{steps['completed']} completed" + (f" · retries: {retried}" if retried else " · no retry")
