"""Cursor-paged lists (docs/design/api.md#paging): `{"next", "previous", "results"}`, keyset pages
in the list's unique order, so a reader following `next` sees every row that was in the list when
it started, and still matches, exactly once — which neither page numbers (OFFSET) nor DRF's
CursorPagination (keyed on the first ordering field only) gives. The cursor is the position's
values as JSON, base64url-encoded: opaque to callers, but no secret."""

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Q, QuerySet
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param

from runs.cursors import column_value
from runs.exceptions import ValidationFailed

T = TypeVar("T")

PAGE_SIZE = 50
# A larger page_size is clamped to this, not refused.
MAX_PAGE_SIZE = 500
# No cursor this API makes is near this long; a longer one is refused before it is decoded.
MAX_CURSOR_CHARS = 1000


@dataclass(frozen=True)
class Position:
    """Where a page starts: just after the row whose ordering values are `values`, or, `back`,
    just before it (a `previous` page)."""

    values: tuple[str, ...]
    back: bool = False

    def encode(self) -> str:
        text = json.dumps(["p" if self.back else "n", *self.values], separators=(",", ":"))
        return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, cursor: str, *, width: int) -> "Position":
        """The position `cursor` encodes, of `width` values; anything else is a 400 naming it."""
        try:
            if len(cursor) > MAX_CURSOR_CHARS:
                raise ValueError("too long")
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
            decoded = json.loads(raw.decode())
        except (ValueError, binascii.Error, UnicodeDecodeError):
            decoded = None
        if (
            not isinstance(decoded, list)
            or len(decoded) != width + 1
            or decoded[0] not in ("n", "p")
            or not all(isinstance(value, str) for value in decoded[1:])
        ):
            raise ValidationFailed("malformed cursor", detail={"cursor": ["not a cursor of this list: follow next"]})
        return cls(values=tuple(decoded[1:]), back=decoded[0] == "p")


@dataclass(frozen=True)
class Page:
    items: list[Any]
    next: Position | None
    previous: Position | None


def _value_text(value: Any) -> str:
    # Microseconds kept: two runs a microsecond apart are two positions.
    return value.isoformat() if isinstance(value, datetime) else str(value)


def _page(rows: list[T], *, size: int, position: Position | None, key: Callable[[T], tuple[str, ...]]) -> Page:
    """The page of `rows` (up to size + 1 read in the direction of travel; one more than a page
    means more follow that way)."""
    more = len(rows) > size
    items = rows[:size]
    if position is not None and position.back:
        items.reverse()
        # Going back: more before means a previous page; the page we came from is after this one.
        previous = Position(key(items[0]), back=True) if more else None
        following = Position(key(items[-1])) if items else None
        return Page(items=items, next=following, previous=previous)
    following = Position(key(items[-1])) if more else None
    # A page reached by a cursor has the rows before it; the first page has none.
    previous = Position(key(items[0]), back=True) if position is not None and items else None
    return Page(items=items, next=following, previous=previous)


def queryset_page(queryset: QuerySet[Any], *, ordering: Sequence[str], cursor: str | None, size: int) -> Page:
    """A page of `queryset` in `ordering` (field names, "-" for descending; unique together)."""
    names = [name.lstrip("-") for name in ordering]
    position = None if cursor is None else Position.decode(cursor, width=len(names))
    if position is None:
        rows = list(queryset.order_by(*ordering)[: size + 1])
    else:
        values = _parsed(queryset, names, position.values)
        back = position.back
        travel = [name[1:] if name.startswith("-") else f"-{name}" for name in ordering] if back else list(ordering)
        rows = list(queryset.filter(_beyond(ordering, values, back=back)).order_by(*travel)[: size + 1])
    return _page(rows, size=size, position=position, key=lambda row: tuple(_value_text(getattr(row, n)) for n in names))


def _parsed(queryset: QuerySet[Any], names: list[str], texts: tuple[str, ...]) -> list[Any]:
    """The cursor's `texts` as the values the database compares: a naive datetime, or one (a
    forged cursor's) that cannot be held in UTC, is no position."""
    fields = [queryset.model._meta.get_field(name) for name in names]
    try:
        values = [column_value(field.to_python(text)) for field, text in zip(fields, texts, strict=True)]
    except (DjangoValidationError, ValueError, TypeError, OverflowError):
        values = []
    if len(values) != len(names) or None in values or any("\x00" in text for text in texts):
        raise ValidationFailed("malformed cursor", detail={"cursor": ["not a cursor of this list: follow next"]})
    return values


def _beyond(ordering: Sequence[str], values: list[Any], *, back: bool) -> Q:
    """The rows past `values` in `ordering` (before them, `back`): lexicographic on the fields —
    the first field past, or equal and the second past, and so on — and the first field at most
    equal besides, which an index on that field can range over."""
    steps = []
    for n, name in enumerate(ordering):
        field = name.lstrip("-")
        later = "lt" if name.startswith("-") != back else "gt"
        equal_before = {ordering[i].lstrip("-"): values[i] for i in range(n)}
        steps.append(Q(**equal_before, **{f"{field}__{later}": values[n]}))
    first = ordering[0].lstrip("-")
    bound = "lte" if ordering[0].startswith("-") != back else "gte"
    either = Q()
    for step in steps:
        either |= step
    return Q(**{f"{first}__{bound}": values[0]}) & either


def sequence_page(items: Sequence[T], *, key: Callable[[T], tuple[str, ...]], cursor: str | None, size: int) -> Page:
    """A page of `items`, which are in ascending order of `key` (unique), e.g. a registry."""
    position = None if cursor is None else Position.decode(cursor, width=len(key(items[0])) if items else 1)
    if position is None:
        rows = list(items[: size + 1])
    elif position.back:
        rows = [item for item in reversed(items) if key(item) < position.values][: size + 1]
    else:
        rows = [item for item in items if key(item) > position.values][: size + 1]
    return _page(rows, size=size, position=position, key=key)


def page_size(requested: int | None) -> int:
    return PAGE_SIZE if requested is None else min(requested, MAX_PAGE_SIZE)


def paged_response(page: Page, *, serializer_class: type[serializers.Serializer[Any]], request: Request) -> Response:
    url = request.build_absolute_uri()

    def link(position: Position | None) -> str | None:
        return None if position is None else replace_query_param(url, "cursor", position.encode())

    results = serializer_class(page.items, many=True, context={"request": request}).data
    return Response({"next": link(page.next), "previous": link(page.previous), "results": results})


def queryset_response(
    queryset: QuerySet[Any],
    ordering: Sequence[str],
    query: dict[str, Any],
    item: type[serializers.Serializer[Any]],
    request: Request,
) -> Response:
    """The page of `queryset` that `query` (validated by a `PageFilterSerializer`) asks for, each row
    as `item` serializes it."""
    page = queryset_page(
        queryset, ordering=ordering, cursor=query.get("cursor"), size=page_size(query.get("page_size"))
    )
    return paged_response(page, serializer_class=item, request=request)
