"""The cross-process notification channels and their payloads (docs/design/deployment.md#notifications).

A note is `pg_notify` inside the writing transaction, delivered only at its commit; it wakes
readers, never replaces their reads. On SQLite `send` does nothing: readers poll.
"""

from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import connection

# payload "<run_id>:<last_seq>" — new events were committed; then, when they fit, a newline and the
# events themselves as the database wrote them (runs.selectors.wire `carried_events`)
EVENTS = "runledger_events"
# payload "<run_id>:<status>" — the run's control state changed (terminal, waiting, pause
# requested); status is the one its transaction committed
CONTROL = "runledger_control"
# payload "<run_id>" — a run became queued, or a running run ended (a claim capped by its owner's
# running runs may pass now); "<run_id>:<seconds>" — a run was queued that falls due (its
# start_after) that many seconds after the notification was sent: nothing to claim until then
QUEUE = "runledger_queue"

# payload "" — webhook deliveries were written or came due again (redelivered)
WEBHOOKS = "runledger_webhooks"
# payload "" — a schedule was created or its due time changed, or a run a schedule created ended
# (a `buffer_one` due time may fire): the workers' schedulers look again (docs/design/schedules.md#scheduler)
SCHEDULES = "runledger_schedules"

CHANNELS = (EVENTS, CONTROL, QUEUE)
# payload "<user_id>" — a credential of the user was revoked (the user deactivated or deleted, a
# token of theirs deleted, a session of theirs ended): the edge's publisher closes their streams,
# the web processes' token caches (runs.http.token_cache) forget their tokens. Not in CHANNELS:
# only those listen to it.
REVOKED = "runledger_revoked"
# payload "user:<user_id>" — the user's row changed (its API tokens' cached users are stale);
# "failure:<failure key>" — a token attempt failed from the address of that key
# (runs.http.throttles): the web processes' token caches (runs.http.token_cache) drop what they
# hold of either. Not in CHANNELS: only the token caches listen to it.
CREDENTIALS = "runledger_credentials"


# (channel, payload), or (channel, payload, (an SQL text expression, its parameters)): a payload the
# database ends with that expression's value as the note is sent (the events a write inserted).
Note = tuple[str, str] | tuple[str, str, tuple[str, list[Any]]]


def send(*notes: Note) -> None:
    """Every note of a write in one statement: each costs the transaction a round trip otherwise."""
    sent = statement(*notes)
    if sent is not None:
        with connection.cursor() as cursor:
            cursor.execute(*sent)


def statement(*notes: Note, scheduled: tuple[UUID, datetime] | None = None) -> tuple[str, list[Any]] | None:
    """The one statement that sends `notes`, for a caller that sends it with its other statements
    (None: nothing to send, or SQLite). `scheduled`: a run and the time it falls due, which QUEUE
    says as the seconds until then by the database's clock, the clock claims compare with."""
    if connection.vendor != "postgresql" or not (notes or scheduled):
        return None
    calls: list[str] = []
    params: list[Any] = []
    for channel, payload, *written in notes:
        if written:
            [(expression, values)] = written
            calls.append(f"pg_notify(%s, %s || {expression})")
            params += [channel, payload, *values]
        else:
            calls.append("pg_notify(%s, %s)")
            params += [channel, payload]
    if scheduled is not None:
        calls.append("pg_notify(%s, %s || ':' || EXTRACT(EPOCH FROM %s - STATEMENT_TIMESTAMP())::text)")
        params += [QUEUE, str(scheduled[0]), scheduled[1]]
    return f"SELECT {', '.join(calls)}", params


def events_committed(run_id: UUID, last_seq: int, events: tuple[str, list[Any]] | None = None) -> Note:
    """`events`: the expression that writes the events themselves (runs.selectors.wire `carried_events_sql`)."""
    return (EVENTS, f"{run_id}:{last_seq}") if events is None else (EVENTS, f"{run_id}:{last_seq}", events)


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


def user_changed(user_id: int) -> Note:
    return CREDENTIALS, f"user:{user_id}"


def token_failed(failure_key: str) -> Note:
    return CREDENTIALS, f"failure:{failure_key}"


def parse_credentials_payload(payload: str) -> tuple[str, str]:
    """("user", user id) or ("failure", failure key); ValueError for anything else."""
    kind, sep, value = payload.partition(":")
    if not sep or kind not in ("user", "failure") or not value:
        raise ValueError(payload)
    return kind, value


def webhooks_due() -> Note:
    return WEBHOOKS, ""


def schedules_changed() -> Note:
    return SCHEDULES, ""


def parse_queue_payload(payload: str) -> float | None:
    """The seconds until the run a QUEUE note names falls due; None: it is due now."""
    _, scheduled, seconds = payload.partition(":")
    try:
        return float(seconds) if scheduled else None
    except ValueError:
        return None


def parse_events_payload(payload: str) -> tuple[str, int]:
    run_id, _, seq = payload.partition("\n")[0].rpartition(":")
    return run_id, int(seq)


def carried_events(payload: str) -> str | None:
    """The events an EVENTS payload carries, as the database wrote them; None if it carries none."""
    _, carried, events = payload.partition("\n")
    return events if carried else None


def parse_control_payload(payload: str) -> tuple[str, str]:
    run_id, _, status = payload.partition(":")
    return run_id, status
