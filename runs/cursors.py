"""Values given in a query string, a header or a cursor: integers (cursors, ids), and the moments
of a list's cursor (docs/design/api.md#paging), each as the database will compare it.

Integers are plain ASCII decimal digits only — no sign, no spaces, no exponent, and no other
Unicode digits (`str.isdigit()` accepts "²", which `int()` then refuses: a 500) — and no larger
than the column they are compared with can hold (a larger one overflows in the database: another
500). A datetime is compared in UTC: Python accepts offsets of up to ±23:59, PostgreSQL none past
±15:59, and year 9999 at -23:59 is past the last datetime either can hold.
"""

import re
from datetime import UTC, datetime
from typing import Any

from django.db import connection

_PLAIN = re.compile(r"[0-9]{1,19}")

BIGINT_MAX = 2**63 - 1


def plain_int(value: str, *, most: int = BIGINT_MAX) -> int | None:
    """`value` as an integer in 0..most, or None when it is not one."""
    if not _PLAIN.fullmatch(value):
        return None
    number = int(value)
    return number if number <= most else None


def largest_of(field_type: str) -> int:
    """The largest value a column of Django's internal type `field_type` holds here."""
    return int(connection.ops.integer_field_range(field_type)[1] or BIGINT_MAX)


def column_value(value: Any) -> Any | None:
    """A cursor's `value` (already its field's `to_python`) as the database compares it: an aware
    datetime in UTC; None for a datetime that has no UTC form (naive, or past either end)."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            return None
        try:
            return value.astimezone(UTC)
        except OverflowError:
            return None
    return value
