"""The staff console, Django's admin (docs/design/operations.md#dashboard): the run admin (`run`), its
filters, displays and commands, the dashboard, webhooks, API tokens, and what keeps hostile URLs from
an admin page answering 500 (`hardening`, docs/design/fair-use.md#admin-input): the console's own
pages always; the site's other model admins only where the project asks (RUNLEDGER_HARDEN_ADMIN)."""

from django.contrib import admin

from runs.admin.dashboard import DashboardAdmin
from runs.admin.hardening import harden_every_admin
from runs.admin.run import RunAdmin
from runs.admin.tokens import ApiTokenAdmin
from runs.admin.webhooks import WebhookDeliveryAdmin, WebhookEndpointAdmin
from runs.conf import conf

if conf.HARDEN_ADMIN:
    harden_every_admin(admin.site)

__all__ = ["ApiTokenAdmin", "DashboardAdmin", "RunAdmin", "WebhookDeliveryAdmin", "WebhookEndpointAdmin"]
