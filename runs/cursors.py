"""Integers given in a query string or a header: cursors, ids.

Plain ASCII decimal digits only — no sign, no spaces, no exponent, and no other Unicode digits
(`str.isdigit()` accepts "²", which `int()` then refuses: a 500) — and no larger than the column
they are compared with can hold (a larger one overflows in the database: another 500).
"""

import re

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
