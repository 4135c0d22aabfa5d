"""Webhook endpoints and their deliveries in the console (docs/design/webhooks.md#operations):
each endpoint with its state, each delivery with its attempts' log, found by endpoint or by run
(`?run_id=<uuid>`), and "redeliver" for staff who may change deliveries. View only, as the runs
are: staff with runs.change_run change or delete endpoints through the API, as their owners do.
A delivery's body (the run's JSON) is shown only to staff who may see runs."""

from typing import Any

from django.contrib import admin, messages
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest

from runs.access import sees_every_run
from runs.admin.hardening import HardenedAdmin
from runs.admin.run import ViewOnly
from runs.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from runs.services import deliveries_redeliver


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(ViewOnly, HardenedAdmin):
    list_display = ["url", "owner", "events", "enabled", "failing_since", "disabled_reason", "created_at"]
    list_filter = ["enabled", "all_runs"]
    search_fields = ["url", "owner__username"]
    list_select_related = ["owner"]
    # Read-only, but Django still builds a form: say the scheme, as Django 6 will assume it.
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    # The secrets are shown once, to the owner, by the API: never here.
    exclude = ["secret", "previous_secret"]


class AttemptInline(admin.TabularInline):
    model = WebhookAttempt
    extra = 0
    can_delete = False
    fields = ("number", "started_at", "duration_ms", "status_code", "response_head", "error", "worker")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ViewOnly, HardenedAdmin):
    list_display = ["__str__", "endpoint", "run_id", "seq", "status", "attempts", "next_attempt_at", "last_error"]
    list_filter = ["status", "event_type", "endpoint"]
    search_fields = ["=run_id"]
    # The run page's link, and any "deliveries of this run" URL.
    extra_lookups = ("run_id",)
    list_select_related = ["endpoint"]
    exclude = ["notification"]
    inlines = [AttemptInline]
    actions = ["redeliver"]

    @admin.display(description="body")
    def body_text(self, delivery: WebhookDelivery) -> str:
        return delivery.notification.body

    @admin.display(description="body")
    def body_withheld(self, delivery: WebhookDelivery) -> str:
        return "(withheld: it is the run's JSON, shown to those who may see runs — runs.view_run)"

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # The body carries the run's input: for those who may see the runs (as the run list
        # decides), not for every holder of view_webhookdelivery.
        return ["body_text"] if sees_every_run(request.user) else ["body_withheld"]

    @admin.action(description="Redeliver the selected deliveries (same webhook-id)", permissions=["redeliver"])
    def redeliver(self, request: HttpRequest, queryset: QuerySet[WebhookDelivery]) -> None:
        count = deliveries_redeliver(ids=list(queryset.values_list("pk", flat=True)))
        self.message_user(request, f"{count} deliveries will be sent again.", messages.SUCCESS)

    def has_redeliver_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("runs.change_webhookdelivery")
