"""Page-numbered lists (docs/design/api.md#urls): count, next, previous, results; 50 a page,
page_size up to 500."""

from collections.abc import Sequence
from typing import Any

from django.db.models import QuerySet
from rest_framework import serializers
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView


class RunPagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    # A larger page_size is clamped to this, not refused.
    max_page_size = 500


def paginated_response(
    *,
    pagination_class: type[PageNumberPagination],
    serializer_class: type[serializers.Serializer[Any]],
    queryset: QuerySet[Any] | Sequence[Any],
    request: Request,
    view: APIView,
) -> Response:
    paginator = pagination_class()
    page = paginator.paginate_queryset(queryset, request, view=view)  # type: ignore[arg-type]  # any sequence pages
    assert page is not None  # page_size is always set
    serializer = serializer_class(page, many=True, context={"request": request})
    return paginator.get_paginated_response(serializer.data)
