"""What a connection says on the wire (libpq's own trace of the PostgreSQL protocol): for tests
that count the round trips a request costs, which the statements Django logs do not show (psycopg
sends a transaction's BEGIN itself, and a pipeline sends several statements at once)."""

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.db import connection


@contextmanager
def wire_messages() -> Iterator[list[tuple[str, str]]]:
    """The messages this thread's connection sends ("F") and receives ("B") meanwhile, in order, each
    as (direction, message type): filled in when the block ends."""
    from psycopg.pq import Trace

    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    messages: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="runledger-wire-") as folder:
        path = Path(folder) / "trace"
        with path.open("w") as out:
            pgconn.trace(out.fileno())
            pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS | Trace.REGRESS_MODE)
            try:
                yield messages
            finally:
                pgconn.untrace()  # flushes libpq's own buffer
        for line in path.read_text().splitlines():
            fields = line.split("\t")
            if len(fields) >= 3 and fields[0] in ("F", "B"):
                messages.append((fields[0], fields[2].split(" ", 1)[0]))


def round_trips(messages: list[tuple[str, str]]) -> list[list[str]]:
    """The round trips in `messages`: each what the client sent before it next waited for an answer
    (a run of sent messages that an answer follows)."""
    trips: list[list[str]] = []
    sending: list[str] = []
    for direction, kind in messages:
        if direction == "F":
            sending.append(kind)
        elif sending:
            trips.append(sending)
            sending = []
    return trips
