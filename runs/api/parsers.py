"""The one request parser of the API (docs/design/events.md#storable): JSON, bounded (a body over
DATA_UPLOAD_MAX_MEMORY_SIZE is a 413), and storable as it was sent — what would break later (deep
nesting, numbers that overflow to infinity, NUL, lone surrogates) is refused here as a malformed
body (400), by the check agents' output passes (runs.storable)."""

from collections.abc import Mapping
from typing import IO, Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError

from runs.storable import value_problem


class JSONParser(parsers.JSONParser):
    def parse(
        self, stream: IO[Any], media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
    ) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise ParseError("JSON nested too deep") from exc
        problem = value_problem(data)
        if problem is not None:
            raise ParseError(f"JSON that cannot be stored: {problem}")
        return data
