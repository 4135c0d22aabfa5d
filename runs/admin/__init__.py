"""The staff console (Django's admin): the run admin (`run`), its list filters (`filters`), how it
displays runs and events (`display`), its commands (`commands`), the dashboard (`dashboard`), webhook
endpoints and deliveries (`webhooks`), API tokens (`tokens`), and what keeps hostile URLs from an
admin page answering 500 (`hardening`): the console's own pages always; every other model admin of
the site (users, groups) only where the project asks, with RUNLEDGER_HARDEN_ADMIN, for the app
changes nothing of the site it is added to by itself."""

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
