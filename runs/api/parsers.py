"""The one request parser of the API: JSON, bounded, and storable as it was sent.

DRF's own JSONParser already refuses bodies over DATA_UPLOAD_MAX_MEMORY_SIZE (it reads through
`request.body`, which raises RequestDataTooBig → 413). What it accepts can still break later,
far from the request: nesting deep enough to exhaust the recursion limit, numbers that overflow to
infinity (no JSON can carry them back), and strings PostgreSQL refuses to store (NUL, lone UTF-16
surrogates). Those are refused here as malformed bodies (400), so no bad input reaches a 500.
"""

import math
from collections.abc import Mapping
from typing import IO, Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError

MAX_DEPTH = 64


def _bad_string(value: str) -> bool:
    if "\x00" in value:
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a \uD800-style escape
        return True
    return False


def check_storable(value: Any) -> None:
    """Raise ParseError unless `value` nests at most MAX_DEPTH deep and every string and number
    in it can be stored and served back as JSON. Iterative, so it cannot recurse too deep itself."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                raise ParseError(f"JSON nested deeper than {MAX_DEPTH} levels")
            if isinstance(item, dict):
                for key, child in item.items():
                    if _bad_string(key):
                        raise ParseError("JSON strings may not contain NUL or unpaired surrogates")
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, str):
            if _bad_string(item):
                raise ParseError("JSON strings may not contain NUL or unpaired surrogates")
        elif isinstance(item, float) and not math.isfinite(item):
            raise ParseError("JSON numbers must be finite")


class JSONParser(parsers.JSONParser):
    def parse(
        self, stream: IO[Any], media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
    ) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise ParseError("JSON nested too deep") from exc
        check_storable(data)
        return data
