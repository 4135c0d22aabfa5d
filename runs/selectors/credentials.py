"""Which credentials still hold, many at once: the streams' re-check of who holds each open
stream (runs.streaming.guard) reads them in a handful of queries for a whole process. The users
themselves (active, seeing every run) are `runs.selectors.users_active`, by the visibility rule.
"""

from collections.abc import Collection
from datetime import datetime
from importlib import import_module
from typing import Any

from django.conf import settings
from django.db.models import Subquery
from django.utils import timezone
from rest_framework.authtoken.models import Token

from runs.models import AuthFailure


def token_users(*, keys: Collection[str]) -> dict[str, int]:
    """The user id of each of `keys` that is an existing API token."""
    return dict(Token.objects.filter(key__in=keys).values_list("key", "user_id"))


def token_with_failure(*, key: str, failures: tuple[str, int, datetime] | None) -> tuple[Token | None, datetime | None]:
    """The API token `key` with its user and — in the same statement, so that a request's
    authentication is one round trip — given `failures` = (failure key, n, since), the n-th newest
    failure of that key after `since` (runs.http.throttles); (None, None) when `key` is no token."""
    tokens = Token.objects.select_related("user")
    if failures is not None:
        failure_key, nth, since = failures
        newest = AuthFailure.objects.filter(key=failure_key, failed_at__gt=since).order_by("-failed_at")
        tokens = tokens.annotate(block_failed_at=Subquery(newest.values("failed_at")[nth - 1 : nth]))
    token = tokens.filter(key=key).first()
    if token is None:
        return None, None
    return token, getattr(token, "block_failed_at", None)


def _session_model() -> Any:
    """The sessions' table when the engine keeps one (db, cached_db), else None."""
    store = import_module(settings.SESSION_ENGINE).SessionStore
    return store.get_model_class() if hasattr(store, "get_model_class") else None


def sessions_kept() -> bool:
    """Whether the session engine keeps rows to look sessions up in (signed cookies or the cache
    alone keep none: their sessions cannot be looked up, so none is taken for ended)."""
    return _session_model() is not None


def sessions_open(*, keys: Collection[str]) -> set[str]:
    """Those of `keys` whose session exists and has not expired (`sessions_kept` engines only)."""
    rows = _session_model().objects.filter(session_key__in=keys, expire_date__gt=timezone.now())
    return set(rows.values_list("session_key", flat=True))
