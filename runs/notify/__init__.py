"""LISTEN/NOTIFY, for the services that send and the worker and streams that listen
(docs/design/deployment.md#notifications): `channels` (the channels, their payloads, `send`) and
`listener` (the reconnecting LISTEN connection).
"""

# Modules (docs/hooks/reference.py --write keeps this index):
#
#     channels.py  The cross-process notification channels and their payloads
#     listener.py  One PostgreSQL LISTEN connection per process that reconnects by itself

from runs.notify.channels import (
    CHANNELS,
    CONTROL,
    CREDENTIALS,
    EVENTS,
    QUEUE,
    REVOKED,
    SCHEDULES,
    WEBHOOKS,
    Note,
    carried_events,
    control_changed,
    credential_revoked,
    events_committed,
    parse_control_payload,
    parse_credentials_payload,
    parse_events_payload,
    parse_queue_payload,
    parse_revoked_payload,
    run_queued,
    schedules_changed,
    send,
    slot_freed,
    statement,
    token_failed,
    user_changed,
    webhooks_due,
)
from runs.notify.listener import APPLICATION_NAME_PREFIX, Listener, conninfo

__all__ = [
    "APPLICATION_NAME_PREFIX",
    "CHANNELS",
    "CONTROL",
    "CREDENTIALS",
    "EVENTS",
    "QUEUE",
    "REVOKED",
    "SCHEDULES",
    "WEBHOOKS",
    "Listener",
    "Note",
    "carried_events",
    "conninfo",
    "control_changed",
    "credential_revoked",
    "events_committed",
    "parse_control_payload",
    "parse_credentials_payload",
    "parse_events_payload",
    "parse_queue_payload",
    "parse_revoked_payload",
    "run_queued",
    "schedules_changed",
    "send",
    "slot_freed",
    "statement",
    "token_failed",
    "user_changed",
    "webhooks_due",
]
