"""The plain answers (runs.api.plain) beside the DRF views they stand in front of, for the tests that
compare the two: a URLconf with each view also under /drf/, as `as_view` makes it without the plain
path, those modules' marks, and one request sent to both."""

from collections.abc import Callable
from typing import TypeVar

import pytest
from django.contrib.auth.models import User
from django.urls import URLPattern, URLResolver, include, path

from runs.api.plain import Plain
from tests.support.db import token_for

T = TypeVar("T")


def drf_beside(views: dict[str, type[Plain]]) -> list[URLPattern | URLResolver]:
    """The project's URLs, and each of `views` (by its route below /api/) at the same route below /drf/
    without the plain path: a test module's `urlpatterns`."""
    return [
        *(path(f"drf/{route}", super(Plain, view).as_view()) for route, view in views.items()),
        path("", include("config.urls")),
    ]


def marks(module: str) -> list[pytest.MarkDecorator]:
    """The marks of the test module `module` that compares the two: its URLconf (`drf_beside`), a
    database committed to as a real request's is, both backends, a timeout."""
    return [
        pytest.mark.django_db(transaction=True),
        pytest.mark.sqlite,
        pytest.mark.timeout(60),
        pytest.mark.urls(module),
    ]


def to_both(send: Callable[[str], T]) -> tuple[T, T]:
    """`send(prefix)` to the plain path (`/api`), then to the DRF view (`/drf`)."""
    return send("/api"), send("/drf")


def token(user: User) -> dict[str, str]:
    """The headers of a request with a new API token of `user`'s."""
    return {"Authorization": f"Token {token_for(user)}"}
