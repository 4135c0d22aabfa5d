"""What a run may store as JSON (docs/design/events.md#storable): one check for request input (a
400, runs/api/parsers.py) and for everything an agent produces (its run fails `invalid_output`),
refusing what `json.dumps` accepts but the database refuses or cannot give back — NaN, ±Infinity,
NUL, lone surrogates, over-long integers, too-deep nesting — and what is not JSON at all."""

import json
import math
from typing import Any

# The deepest nesting a stored value may have, counting the outermost object or array as 1.
MAX_DEPTH = 64
# Python refuses to turn longer integers into text (sys.get_int_max_str_digits, 4300 digits by
# default), so JSON holding one could be stored but never read back; a bit less, to stay clear.
_MAX_INT_BITS = 14_000

# A path is a chain of (parent, key) pairs, built only as far as the walk goes and rendered only
# for the one value that fails.
_Path = tuple[Any, str | int] | None


def _render(path: _Path) -> str:
    parts: list[str] = []
    while path is not None:
        path, key = path
        if isinstance(key, int):
            parts.append(f"[{key}]")
        elif key.isidentifier():
            parts.append(f".{key}")
        else:
            parts.append(f"[{json.dumps(key)}]")
    return "$" + "".join(reversed(parts))


def _string_problem(value: str) -> str | None:
    if "\x00" in value:
        return "a string holds a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "a string holds an unpaired UTF-16 surrogate"
    return None


def _scalar_problem(item: Any) -> str | None:
    if item is None or isinstance(item, bool):
        return None
    if isinstance(item, str):
        return _string_problem(item)
    if isinstance(item, int):
        return "an integer too long to read back" if item.bit_length() > _MAX_INT_BITS else None
    if isinstance(item, float):
        return None if math.isfinite(item) else f"{item!r} is not a finite number"
    return f"a {type(item).__name__} is not a JSON value"


def value_problem(value: Any, *, max_bytes: int | None = None) -> str | None:
    """Why `value` cannot be stored and read back as the JSON it is, as "<path>: <what>" (the path
    from `$`, the value itself), or None when it can. With `max_bytes`, its JSON text (UTF-8) must
    not be longer. Iterative, so no nesting makes the check itself recurse too deep."""
    stack: list[tuple[Any, int, _Path]] = [(value, 1, None)]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, dict | list | tuple):
            if depth > MAX_DEPTH:
                return f"{_render(path)}: nested deeper than {MAX_DEPTH} levels"
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        return f"{_render(path)}: a key is a {type(key).__name__}, not a string"
                    problem = _string_problem(key)
                    if problem is not None:
                        return f"{_render((path, key))}: the key: {problem}"
                    stack.append((child, depth + 1, (path, key)))
            else:
                stack.extend((child, depth + 1, (path, i)) for i, child in enumerate(item))
            continue
        problem = _scalar_problem(item)
        if problem is not None:
            return f"{_render(path)}: {problem}"
    if max_bytes is not None:
        text = json.dumps(value, ensure_ascii=False)
        # Cheap first: no UTF-8 character takes more than four bytes.
        if 4 * len(text) > max_bytes and (size := len(text.encode("utf-8"))) > max_bytes:
            return f"$: {size} bytes of JSON, more than the {max_bytes} allowed"
    return None


_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def json_bytes(value: Any) -> int:
    """The size of `value` as compact UTF-8 JSON — what an answer carries of it: the one measure of
    the bytes a run stores (`Run.stored_bytes`) and of the bounds on lists and pages."""
    text = _compact(value)
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def storable_text(text: str, *, max_chars: int = 10_000) -> str:
    """`text` (an exception's message, say) made storable: NUL and unpaired surrogates replaced,
    cut to `max_chars`. For text the platform writes about an agent, where refusing is no option."""
    cleaned = text.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
    return cleaned if len(cleaned) <= max_chars else cleaned[: max_chars - 1] + "…"


def same_json(a: Any, b: Any) -> bool:
    """Whether `a` and `b` are the same JSON value — the one rule for "the same body" (an idempotent
    create's retry) and "the same input" (a resume's retry). A number is a JSON number, so 1 is 1.0;
    but true is not 1 (Python's `==` says it is), and key order does not matter.

    PostgreSQL's jsonb keeps a number as an exact decimal and gives it back in its plainest form, so
    a float sent as 1e+308 reads back as an integer of 309 digits, which is not exactly the float's
    binary value: an integer and a float are the same when the integer, as a float, is that float."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        try:
            return float(a) == float(b)
        except OverflowError:  # an integer beyond any float is no float's reading
            return False
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)
