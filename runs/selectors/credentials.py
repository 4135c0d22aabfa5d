"""Which credentials hold (docs/design/api.md#authentication): a request's API token, found by its
key's digest with its address's throttle standing in one statement, and many at once for the
streams' re-check of who holds each open stream (runs.streaming.guard). The users themselves
(active, seeing every run) are `runs.selectors.users_active`, by the visibility rule."""

from collections.abc import Collection
from datetime import UTC, datetime
from importlib import import_module
from typing import Any

from django.conf import settings
from django.db.models import Q, QuerySet, Subquery
from django.utils import timezone

from runs.access import User
from runs.models import ApiToken, AuthFailure, key_digest
from runs.selectors.compiled import CompiledRead, Param, as_first


def _unexpired(now: datetime) -> Q:
    return Q(expires_at__isnull=True) | Q(expires_at__gt=now)


def token_users(*, ids: Collection[int]) -> dict[int, int]:
    """The user id of each of the API tokens `ids` that still exists and has not expired."""
    return dict(ApiToken.objects.filter(_unexpired(timezone.now()), pk__in=ids).values_list("pk", "user_id"))


def _token(*, digest: str) -> QuerySet[ApiToken]:
    return as_first(ApiToken.objects.select_related("user").filter(digest=digest))


def _token_and_failure(nth: int, *, digest: str, failure_key: str, since: datetime) -> QuerySet[ApiToken]:
    newest = AuthFailure.objects.filter(key=failure_key, failed_at__gt=since).order_by("-failed_at")
    tokens = ApiToken.objects.select_related("user")
    tokens = tokens.annotate(block_failed_at=Subquery(newest.values("failed_at")[nth - 1 : nth]))
    return as_first(tokens.filter(digest=digest))


_DIGEST = Param(ApiToken._meta.get_field("digest"), ("sample digest 1", "sample digest 2"))
_TOKEN = CompiledRead(ApiToken, _token, digest=_DIGEST)
_TOKEN_AND_FAILURE = CompiledRead(
    ApiToken,
    _token_and_failure,
    digest=_DIGEST,
    failure_key=Param(AuthFailure._meta.get_field("key"), ("sample key 1", "sample key 2")),
    since=Param(
        AuthFailure._meta.get_field("failed_at"),
        (datetime(2001, 2, 3, 4, 5, 6, 7, UTC), datetime(2002, 3, 4, 5, 6, 7, 8, UTC)),
    ),
)


def token_with_failure(
    *, key: str, failures: tuple[str, int, datetime] | None
) -> tuple[ApiToken | None, datetime | None]:
    """The API token whose key is `key`, with its user and — in the same statement, so that a
    request's authentication is one round trip — given `failures` = (failure key, n, since), the
    n-th newest failure of that key after `since` (runs.http.throttles); (None, None) when `key` is
    no token, or one that has expired. Compiled once per process (runs.selectors.compiled).

    Found by the key's digest on a unique index: the only comparison is the database's equality
    of two digests, and what its timing could tell is a digest's bytes, never the key's."""
    if failures is None:
        found = _TOKEN.objects(digest=key_digest(key))
    else:
        failure_key, nth, since = failures
        found = _TOKEN_AND_FAILURE.objects(nth, digest=key_digest(key), failure_key=failure_key, since=since)
    token = found[0] if found else None
    if token is None or (token.expires_at is not None and token.expires_at <= timezone.now()):
        return None, None
    return token, getattr(token, "block_failed_at", None)


def tokens_of(*, user: User) -> QuerySet[ApiToken]:
    """The user's own API tokens (staff see only theirs too: a token is its holder's alone)."""
    return ApiToken.objects.filter(user_id=user.pk).select_related("issued_by")


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
