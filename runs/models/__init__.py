"""The app's data and constraints, one module per noun (docs/layout.md); Django and migrations find
every model here, as `runs.models.<Name>`.
"""

# Modules (docs/hooks/reference.py --write keeps this index):
#
#     attempts.py       A run's execution attempts, one per claim
#     auth_failures.py  Failed sign-ins and token authentications, counted
#     events.py         A run's events, ordered by a gap-free `seq`
#     idempotency.py    Idempotency records: the first answer to a retried create or bulk command
#     runs.py           A run: what it runs, its budgets, its state and how it ended
#     schedules.py      Schedules: recurring runs, each due time fired exactly once
#     tokens.py         API tokens: each a user's named key, stored as the SHA-256 digest of the key —
#                       never the key
#     webhooks.py       Webhooks: the endpoints users register

from runs.models.attempts import AttemptOutcome, RunAttempt
from runs.models.auth_failures import AuthFailure
from runs.models.events import RunEvent
from runs.models.idempotency import IdempotencyRecord
from runs.models.runs import (
    LIVE_VALUES,
    PRIORITY_MAX,
    PRIORITY_MIN,
    TERMINAL_VALUES,
    URGENT_MAX,
    Dashboard,
    Run,
    _default_max_attempts,
)
from runs.models.schedules import Overlap, Schedule
from runs.models.tokens import ApiToken, key_digest
from runs.models.webhooks import (
    DeliveryStatus,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookNotification,
)

__all__ = [
    "LIVE_VALUES",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "TERMINAL_VALUES",
    "URGENT_MAX",
    "ApiToken",
    "AttemptOutcome",
    "AuthFailure",
    "Dashboard",
    "DeliveryStatus",
    "IdempotencyRecord",
    "Overlap",
    "Run",
    "RunAttempt",
    "RunEvent",
    "Schedule",
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookEndpoint",
    "WebhookNotification",
    "_default_max_attempts",
    "key_digest",
]
