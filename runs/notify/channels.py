"""The cross-process notification channels and their payloads (docs/design/deployment.md#notifications).

A note is `pg_notify` inside the writing transaction, delivered only at its commit; it wakes
readers, never replaces their reads. On SQLite `send` does nothing: readers poll.
"""

from uuid import UUID

from django.db import connection

# payload "<run_id>:<last_seq>" — new events were committed
EVENTS = "runledger_events"
# payload "<run_id>:<status>" — the run's control state changed (terminal, waiting, pause
# requested); status is the one its transaction committed
CONTROL = "runledger_control"
# payload "<run_id>" — a run became queued, or a running run ended (a claim capped by its owner's
# running runs may pass now)
QUEUE = "runledger_queue"

# payload "" — webhook deliveries were written or came due again (redelivered)
WEBHOOKS = "runledger_webhooks"

CHANNELS = (EVENTS, CONTROL, QUEUE)
# payload "<user_id>" — a credential of the user was revoked (the user deactivated or deleted, a
# token of theirs deleted, a session of theirs ended): the edge's publisher closes their streams.
# Not in CHANNELS: only the publisher listens to it.
REVOKED = "runledger_revoked"


# (channel, payload)
Note = tuple[str, str]


def send(*notes: Note) -> None:
    """Every note of a write in one statement: each costs the transaction a round trip otherwise."""
    for sql, params in statements(*notes):
        with connection.cursor() as cursor:
            cursor.execute(sql, params)


def statements(*notes: Note) -> list[tuple[str, list[str]]]:
    """The statement `send` sends, for a write that sends it together with others; none on SQLite."""
    if connection.vendor != "postgresql" or not notes:
        return []
    calls = ", ".join("pg_notify(%s, %s)" for _ in notes)
    return [(f"SELECT {calls}", [part for note in notes for part in note])]


def events_committed(run_id: UUID, last_seq: int) -> Note:
    return EVENTS, f"{run_id}:{last_seq}"


def control_changed(run_id: UUID, status: str) -> Note:
    return CONTROL, f"{run_id}:{status}"


def run_queued(run_id: UUID) -> Note:
    return QUEUE, str(run_id)


def slot_freed(run_id: UUID) -> Note:
    return QUEUE, str(run_id)


def credential_revoked(user_id: int) -> Note:
    return REVOKED, str(user_id)


def parse_revoked_payload(payload: str) -> int:
    return int(payload)


def webhooks_due() -> Note:
    return WEBHOOKS, ""


def parse_events_payload(payload: str) -> tuple[str, int]:
    run_id, _, seq = payload.rpartition(":")
    return run_id, int(seq)


def parse_control_payload(payload: str) -> tuple[str, str]:
    run_id, _, status = payload.partition(":")
    return run_id, status
