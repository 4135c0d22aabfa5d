"""The database's clock, the one every process judges time-bound state by (docs/design/execution.md#leases)."""

from datetime import datetime

from django.db import connection
from django.utils import timezone


def db_now() -> datetime:
    """The database's clock. Leases are renewed by workers and judged by sweepers on other
    machines; reading both against this one clock means no machine's clock skew can expire a live
    lease or a deadline early."""
    if connection.vendor != "postgresql":
        # To the millisecond, as SQLite's own clock reads (runs.services.ranking's DbNow()): a time taken
        # here is never ahead of the one the claims compare it with.
        local = timezone.now()
        return local.replace(microsecond=local.microsecond // 1000 * 1000)
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        row = cursor.fetchone()
    assert row is not None
    now: datetime = row[0]
    return now
