"""The staff console, Django's admin (docs/design/operations.md#dashboard): the run admin (`run`), its
filters, displays and commands, the dashboard, schedules, webhooks, API tokens, and what keeps hostile URLs from
an admin page answering 500 (`hardening`, docs/design/fair-use.md#admin-input): the console's own
pages always; the site's other model admins only where the project asks (RUNLEDGER_HARDEN_ADMIN).
"""

# Modules (docs/hooks/reference.py --write keeps this index):
#
#     charts.py     The dashboard's charts, drawn on the server as inline SVG
#     commands.py   The staff console's commands as a table
#     dashboard.py  The staff dashboard, `/admin/runs/dashboard/`
#     display.py    How the staff console writes times, durations, event data and statuses
#     filters.py    The run list's filters, each cheap whatever the size of the run table
#     hardening.py  What keeps hostile URLs from the console's pages answering 500, for every model
#                   admin on the site
#     matching.py   The run list's "Cancel all that match" and "Stop all that match"
#     priority.py   The run page's "Priority and start" command
#     rerun.py      The run page's "Rerun" button and the links between a run and its reruns
#     results.py    What the run page shows of what a run produced and used
#     run.py        The staff console's run admin
#     schedules.py  Schedules in the console: each with its timing, its next due time and its last
#                   run's status
#     tokens.py     API tokens in the console
#     webhooks.py   Webhook endpoints and their deliveries in the console

from django.contrib import admin

from runs.admin.dashboard import DashboardAdmin
from runs.admin.hardening import harden_every_admin
from runs.admin.run import RunAdmin
from runs.admin.schedules import ScheduleAdmin
from runs.admin.tokens import ApiTokenAdmin
from runs.admin.webhooks import WebhookDeliveryAdmin, WebhookEndpointAdmin
from runs.conf import conf

if conf.HARDEN_ADMIN:
    harden_every_admin(admin.site)

__all__ = [
    "ApiTokenAdmin",
    "DashboardAdmin",
    "RunAdmin",
    "ScheduleAdmin",
    "WebhookDeliveryAdmin",
    "WebhookEndpointAdmin",
]
