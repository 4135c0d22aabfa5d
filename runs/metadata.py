"""A run's metadata (docs/design/api.md#metadata): the caller's own labels — a JSON object of string
keys and string values, bounded as Stripe bounds its metadata, so that users know the rules and a
run's labels stay a small, indexable document whatever a caller sends.

One check for what a create stores and for what a list filter asks, so a filter that could never
match is refused the same way as a value that could never be stored.
"""

from typing import Any

from runs.exceptions import ValidationFailed

MAX_KEYS = 50
MAX_KEY_CHARS = 40
MAX_VALUE_CHARS = 500
# Square brackets: Stripe's rule (its form encoding nests with them). A NUL: PostgreSQL text and
# jsonb hold none. Other control characters: a label is meant to be read and typed back.
_FORBIDDEN = frozenset("[]") | frozenset(chr(c) for c in (*range(32), 127))


def key_problem(key: Any) -> str | None:
    if not isinstance(key, str) or not key:
        return "a key must be a non-empty string"
    if len(key) > MAX_KEY_CHARS:
        return f"a key has at most {MAX_KEY_CHARS} characters"
    if any(char in _FORBIDDEN for char in key):
        return "a key holds no square brackets and no control characters"
    return None


def value_problem(value: Any) -> str | None:
    if not isinstance(value, str):
        return "a value must be a string"
    if len(value) > MAX_VALUE_CHARS:
        return f"a value has at most {MAX_VALUE_CHARS} characters"
    if "\x00" in value:
        return "a value holds no NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "a value holds an unpaired UTF-16 surrogate"
    return None


def check_metadata(metadata: Any, *, field: str = "metadata") -> dict[str, str]:
    """`metadata` as stored, or ValidationFailed naming each key that breaks a rule (detail
    `{field: {key: [problem]}}`), or the object itself when it is not one of at most MAX_KEYS keys."""
    if not isinstance(metadata, dict):
        raise ValidationFailed(f"{field} must be a JSON object", detail={field: ["must be a JSON object"]})
    if len(metadata) > MAX_KEYS:
        message = f"{field} has at most {MAX_KEYS} keys, not {len(metadata)}"
        raise ValidationFailed(message, detail={field: [message]})
    problems = {
        str(key): problem
        for key, value in metadata.items()
        if (problem := key_problem(key) or value_problem(value)) is not None
    }
    if problems:
        said = "; ".join(f"{key!r}: {problem}" for key, problem in problems.items())
        raise ValidationFailed(f"{field}: {said}", detail={field: {key: [p] for key, p in problems.items()}})
    return dict(metadata)
