"""The app's data and constraints, one module per noun (docs/layout.md); Django and migrations find
every model here, as `runs.models.<Name>`."""

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
    "Run",
    "RunAttempt",
    "RunEvent",
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookEndpoint",
    "WebhookNotification",
    "_default_max_attempts",
    "key_digest",
]
