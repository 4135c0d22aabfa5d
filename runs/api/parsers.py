"""The one request parser of the API: JSON, bounded, and storable as it was sent.

DRF's own JSONParser already refuses bodies over DATA_UPLOAD_MAX_MEMORY_SIZE (it reads through
`request.body`, which raises RequestDataTooBig → 413). What it accepts can still break later,
far from the request: nesting deep enough to exhaust the recursion limit, numbers that overflow to
infinity (no JSON can carry them back), and strings PostgreSQL refuses to store (NUL, lone UTF-16
surrogates). Those are refused here as malformed bodies (400), by the same check agents' output
passes (runs.storable), so no bad input reaches a 500.
"""

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
