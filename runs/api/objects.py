"""What the collections of a caller's objects (schedules, webhook endpoints, API tokens) do alike:
their operations' documentation, their list and their URLs (docs/design/api.md#urls)."""

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from django.db.models import QuerySet
from django.urls import URLPattern, path
from drf_spectacular.utils import OpenApiParameter
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from runs.api.apis import PageSerializer, _caller, _valid
from runs.api.base import ApiView
from runs.api.pagination import queryset_response
from runs.api.schema import documented, responses

F = TypeVar("F", bound=Callable[..., Any])


class Operations:
    """The documentation of a collection's operations (`<collection>_<name>`), each on one object
    (`parameter`, its id in the path) unless `parameters` says otherwise; and its list, paged by
    `query`."""

    def __init__(self, collection: str, parameter: OpenApiParameter, query: type[serializers.Serializer[Any]]) -> None:
        self.collection = collection
        self.parameter = parameter
        self.query = query

    def __call__(self, name: str, summary: str, success: dict[int, Any], *errors: int, **more: Any) -> Callable[[F], F]:
        more.setdefault("parameters", [self.parameter])
        return documented(
            operation_id=f"{self.collection}_{name}", summary=summary, responses=responses(success, *errors), **more
        )

    def create(
        self, summary: str, success: type[serializers.Serializer[Any]], *errors: int, request: Any, description: str
    ) -> Callable[[F], F]:
        """A create: a 201 with `success`, its JSON body's refusals (400, 413, 415) and the owner's
        cap on how many they keep (429), besides `errors`."""
        return self(
            "create",
            summary,
            {201: success},
            400,
            413,
            415,
            429,
            *errors,
            description=description,
            request=request,
            parameters=[],
        )

    def destroy(self, summary: str, description: str) -> Callable[[F], F]:
        """A delete of one object: a 204, or a 404."""
        return self("destroy", summary, {204: None}, 404, description=description)

    def list(
        self,
        summary: str,
        description: str,
        page: type[PageSerializer],
        read: Callable[..., QuerySet[Any]],
        ordering: Sequence[str],
    ) -> Callable[[ApiView, Request], Response]:
        """The collection's `get`: the `page` its query asks for of what `read(user=caller)` returns,
        in `ordering`."""

        @self("list", summary, {200: page}, 400, description=description, parameters=[self.query])
        def get(view: ApiView, request: Request) -> Response:
            query = _valid(self.query, request.query_params)
            return queryset_response(read(user=_caller(request)), ordering, query, page.item, request)

        return get


def object_urls(
    noun: str, collection: type[ApiView], detail: type[ApiView], actions: dict[str, type[ApiView]]
) -> list[URLPattern]:
    """A collection's URLs: itself at its root, one object at `<noun>_id/` and each action on it at
    `<noun>_id/<action>/`; named `<noun>-collection`, `<noun>-detail` and `<noun>-<action>`."""
    one = f"<str:{noun}_id>/"
    return [
        path("", collection.as_view(), name=f"{noun}-collection"),
        path(one, detail.as_view(), name=f"{noun}-detail"),
        *(path(f"{one}{action}/", view.as_view(), name=f"{noun}-{action}") for action, view in actions.items()),
    ]
