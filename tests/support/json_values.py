"""Comparing JSON values as a database gives them back."""

from typing import Any


def same_json(a: Any, b: Any) -> bool:
    """True when `a` and `b` are the same JSON value. PostgreSQL's jsonb keeps a number as an exact
    decimal and gives it back in its shortest plain form: a float written as 1e+20 reads back as
    the integer 100000000000000000000. So a float equals whatever number reads back as the same
    float; integers compare exactly, and `true` is never `1`."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b if isinstance(a, int) and isinstance(b, int) else float(a) == float(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b
