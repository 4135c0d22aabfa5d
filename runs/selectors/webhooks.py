"""Reads of webhook endpoints and deliveries (docs/design/webhooks.md)."""

from datetime import datetime
from uuid import UUID

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Min, QuerySet

from runs.access import User
from runs.exceptions import NotFound
from runs.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint


def webhooks_visible(*, user: User) -> QuerySet[WebhookEndpoint]:
    """The endpoints `user` may read and change: their own (staff with runs.change_run: all)."""
    endpoints = WebhookEndpoint.objects.order_by("created_at", "id")
    return endpoints if user.has_perm("runs.change_run") else endpoints.filter(owner_id=user.pk)


def webhook_get(*, endpoint_id: UUID | str, user: User) -> WebhookEndpoint:
    """The endpoint `endpoint_id` among those `user` may see (`webhooks_visible`), else `NotFound`."""
    try:
        return webhooks_visible(user=user).get(pk=endpoint_id)
    except (WebhookEndpoint.DoesNotExist, ValueError, DjangoValidationError) as exc:
        raise NotFound(f"webhook endpoint {endpoint_id} not found") from exc


def webhook_deliveries(*, endpoint: WebhookEndpoint) -> QuerySet[WebhookDelivery]:
    """An endpoint's deliveries, newest first (`webhookdelivery_endpoint`)."""
    return WebhookDelivery.objects.filter(endpoint=endpoint).order_by("-created_at", "-id")


def webhooks_oldest_pending() -> datetime | None:
    """When the oldest notification still to deliver to an enabled endpoint was written."""
    pending = WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING, endpoint__enabled=True)
    return pending.aggregate(first=Min("created_at"))["first"]


def webhooks_failing(*, limit: int = 20) -> list[WebhookEndpoint]:
    """Endpoints failing every attempt now, or disabled for it: the dashboard's list."""
    failing = WebhookEndpoint.objects.filter(failing_since__isnull=False) | WebhookEndpoint.objects.exclude(
        disabled_reason=""
    )
    return list(failing.select_related("owner").order_by("failing_since")[:limit])
