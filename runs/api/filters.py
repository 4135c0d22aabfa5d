"""The lists' query parameters (docs/design/api.md#lists): the page's (`cursor`, `page_size`) and
the run list's filters — several values of one filter as a comma list (`status=queued,running`),
never the key given twice — and `metadata.<key>=<value>`, repeatable with other keys, which a
serializer cannot declare (its names are the caller's), read by `metadata_filter`."""

import re
from typing import Any

from django.http import QueryDict
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from runs.api.pagination import MAX_CURSOR_CHARS
from runs.api.serializers import RUN_STATUSES
from runs.exceptions import ValidationFailed
from runs.metadata import MAX_KEYS, key_problem, value_problem
from runs.transitions import CancelCode, FailCode, StopCode

END_CODES = sorted({c.value for c in (*FailCode, *CancelCode, *StopCode)})
METADATA_PREFIX = "metadata."


class StrictIntegerField(serializers.IntegerField):
    """An integer given as plain decimal digits (a cursor, a page): no sign, no "1.0", no spaces."""

    def get_value(self, dictionary: Any) -> Any:
        # DRF reads `?after_seq=` (empty) from a query string as "not given"; a cursor that is
        # given must be well formed (docs/design/streaming.md#cursors), so an empty one is
        # validated, and refused.
        if self.field_name in dictionary and dictionary.get(self.field_name) == "":
            return ""
        return super().get_value(dictionary)

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, str) and not re.fullmatch(r"[0-9]{1,30}", data):
            self.fail("invalid")
        return int(super().to_internal_value(data))


@extend_schema_field(OpenApiTypes.STR)
class CommaListField(serializers.Field):
    """Any of `choices`, as a comma list (`queued,running`); one unknown value refuses it all."""

    def __init__(self, *, choices: list[str], **kwargs: Any) -> None:
        self.choices = choices
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> list[str]:
        # A query string carries a comma list; a JSON body (a bulk command's filter) may send a list.
        values = data.split(",") if isinstance(data, str) else None
        if isinstance(data, list) and all(isinstance(value, str) for value in data):
            values = data
        if not values or any(value not in self.choices for value in values):
            raise serializers.ValidationError(f"a comma list of: {', '.join(self.choices)}")
        return values

    def to_representation(self, value: Any) -> str:
        return ",".join(value)


class QuerySerializer(serializers.Serializer[Any]):
    """A query string's parameters, each given once at most: a key given twice is a 400 naming it
    (docs/design/api.md#lists), where a QueryDict would silently take the last value."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, QueryDict):
            twice = {name: [_twice(field)] for name, field in self.fields.items() if len(data.getlist(name)) > 1}
            if twice:
                raise serializers.ValidationError(twice)
        return super().to_internal_value(data)


def _twice(field: serializers.Field) -> str:
    several = ", with several values as one comma list (queued,running)" if isinstance(field, CommaListField) else ""
    return f"given more than once: give it once{several}"


class PageFilterSerializer(QuerySerializer):
    cursor = serializers.CharField(
        max_length=MAX_CURSOR_CHARS, required=False, help_text="from a page's `next` or `previous`; opaque"
    )
    page_size = StrictIntegerField(min_value=1, required=False, help_text="default 50; above 500 means 500")


def page_filter(component_name: str, doc: str | None = None) -> type[PageFilterSerializer]:
    """A list's page query alone (`cursor`, `page_size`), named `component_name` in the schema."""

    @extend_schema_serializer(component_name=component_name)
    class PageFilter(PageFilterSerializer):
        __doc__ = doc

    return PageFilter


class RunFilterSerializer(QuerySerializer):
    """The run list's filters but metadata (whose names are the caller's): the list's query and a
    bulk command's body (runs.api.bulk) validate them with these fields, and `run_filters` hands them
    to `runs.selectors.run_list`, the one rule of what matches."""

    status = CommaListField(
        choices=RUN_STATUSES, required=False, help_text="one status or a comma list: `queued,running`"
    )
    end_code = CommaListField(choices=END_CODES, required=False, help_text="one end code or a comma list")
    agent = serializers.CharField(max_length=64, required=False)
    parent = serializers.UUIDField(required=False)  # type: ignore[assignment]  # DRF pops declared fields
    schedule = serializers.UUIDField(required=False, help_text="the runs a schedule created")
    created_after = serializers.DateTimeField(required=False, help_text="created at or after (ISO 8601)")
    created_before = serializers.DateTimeField(required=False, help_text="created before (ISO 8601)")


@extend_schema_serializer(component_name="RunListFilter")
class RunListFilterSerializer(RunFilterSerializer, PageFilterSerializer):
    pass


def run_filters(data: dict[str, Any]) -> dict[str, Any]:
    """`RunFilterSerializer`'s validated data as `run_list`'s keywords."""
    return {
        "status": data.get("status", ()),
        "end_code": data.get("end_code", ()),
        "agent": data.get("agent"),
        "parent": data.get("parent"),
        "schedule": data.get("schedule"),
        "created_after": data.get("created_after"),
        "created_before": data.get("created_before"),
    }


METADATA_PARAMETER = OpenApiParameter(
    "metadata.{key}",
    str,
    OpenApiParameter.QUERY,
    required=False,
    description="runs whose metadata holds `key` with this value, e.g. `metadata.customer=42`; repeatable "
    "with other keys, all must match",
)


def metadata_filter(query: QueryDict) -> dict[str, str]:
    """The `metadata.<key>=<value>` parameters of `query` as {key: value}: each key once, each key
    and value one that a run could store (runs.metadata), else a 400 naming the parameter."""
    wanted: dict[str, str] = {}
    problems: dict[str, list[str]] = {}
    for name, values in query.lists():
        if not name.startswith(METADATA_PREFIX):
            continue
        key = name.removeprefix(METADATA_PREFIX)
        problem = (
            key_problem(key)
            or (len(values) > 1 and "given more than once: one value per key")
            or value_problem(values[0])
        )
        if problem:
            problems[name] = [problem]
        else:
            wanted[key] = values[0]
    if len(wanted) > MAX_KEYS:
        problems["metadata"] = [f"at most {MAX_KEYS} keys: no run has more"]
    if problems:
        raise ValidationFailed("; ".join(f"{name}: {p[0]}" for name, p in problems.items()), detail=problems)
    return wanted
