"""Webhook endpoints registered, changed, rotated and deleted (docs/design/webhooks.md#endpoints).

Bad input is a ValidationFailed naming the field, before anything is written. A URL is checked as
written, never resolved (runs.http.outbound.url_problem).
"""

import base64
import secrets
from datetime import timedelta
from typing import Any
from uuid import UUID

from django.db import transaction
from django.utils import timezone

from runs.access import User, sees_every_run
from runs.conf import conf
from runs.events import WEBHOOK_EVENTS
from runs.exceptions import PermissionDenied, ValidationFailed
from runs.http.outbound import url_problem
from runs.metadata import check_metadata
from runs.models import WebhookEndpoint
from runs.selectors.webhooks import webhook_get
from runs.services.quotas import check_webhooks

URL_MAX = 2000
SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    """A Standard Webhooks secret: `whsec_` and 24 random bytes in base64."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()


def _refuse(field: str, problem: str) -> ValidationFailed:
    return ValidationFailed(f"{field}: {problem}", detail={field: [problem]})


def _checked(changes: dict[str, Any], owner: User) -> dict[str, Any]:
    checked: dict[str, Any] = {}
    if "url" in changes:
        url = changes["url"]
        if not isinstance(url, str) or not url or len(url) > URL_MAX:
            raise _refuse("url", f"must be a URL of at most {URL_MAX} characters")
        if (problem := url_problem(url)) is not None:
            raise _refuse("url", problem)
        checked["url"] = url
    if "events" in changes:
        events = changes["events"]
        if not isinstance(events, list) or not events or any(e not in WEBHOOK_EVENTS for e in events):
            raise _refuse("events", f"must be a non-empty list of {', '.join(WEBHOOK_EVENTS)}")
        checked["events"] = sorted(set(events))
    if "metadata" in changes:
        checked["metadata"] = check_metadata(changes["metadata"] or {})
    if "all_runs" in changes:
        if changes["all_runs"] and not sees_every_run(owner):
            raise PermissionDenied("all_runs needs runs.view_run (seeing every run)")
        checked["all_runs"] = bool(changes["all_runs"])
    if "enabled" in changes:
        checked["enabled"] = bool(changes["enabled"])
    return checked


def webhook_create(*, owner: User, url: str, events: list[str], **optional: Any) -> WebhookEndpoint:
    """A new endpoint of `owner`; its `secret` is shown once, in the answer to this. The cap on
    endpoints is checked last, after the input (docs/design/fair-use.md#refusals)."""
    fields = _checked({"url": url, "events": events, **optional}, owner)
    now = timezone.now()
    with transaction.atomic():
        check_webhooks(owner.pk)
        return WebhookEndpoint.objects.create(
            owner_id=owner.pk, secret=new_secret(), created_at=now, updated_at=now, **fields
        )


def webhook_update(*, endpoint_id: UUID | str, user: User, changes: dict[str, Any]) -> WebhookEndpoint:
    with transaction.atomic():
        endpoint = webhook_get(endpoint_id=endpoint_id, user=user)
        fields = _checked(changes, endpoint.owner)
        if fields.get("enabled"):
            # Enabled again by its owner: its failures so far no longer count toward disabling it.
            fields.update(disabled_reason="", failing_since=None)
        elif "enabled" in fields:
            fields["disabled_reason"] = ""
        for name, value in fields.items():
            setattr(endpoint, name, value)
        endpoint.updated_at = timezone.now()
        endpoint.save(update_fields=[*fields, "updated_at"])
    return endpoint


def webhook_delete(*, endpoint_id: UUID | str, user: User) -> None:
    """Delete the endpoint with its deliveries and their log. Its row is locked first: a delivery
    written for it (`enqueue`) or an attempt logged (`deliveries_record`) meanwhile commits before,
    and is deleted with it, or finds it gone."""
    with transaction.atomic():
        endpoint = webhook_get(endpoint_id=endpoint_id, user=user)
        # Locked before Django reads what to delete with it: what committed before the lock is read.
        if WebhookEndpoint.objects.select_for_update().filter(pk=endpoint.pk).exists():
            endpoint.delete()


def webhook_rotate_secret(*, endpoint_id: UUID | str, user: User) -> WebhookEndpoint:
    """A new secret; the old one still signs (beside it) for RUNLEDGER_WEBHOOKS_ROTATION_OVERLAP_SECONDS."""
    with transaction.atomic():
        endpoint = webhook_get(endpoint_id=endpoint_id, user=user)
        now = timezone.now()
        endpoint.previous_secret = endpoint.secret
        endpoint.previous_secret_expires_at = now + timedelta(seconds=conf.WEBHOOKS_ROTATION_OVERLAP_SECONDS)
        endpoint.secret = new_secret()
        endpoint.updated_at = now
        endpoint.save(update_fields=["previous_secret", "previous_secret_expires_at", "secret", "updated_at"])
    return endpoint
