"""Who a request is (docs/design/api.md#authentication), read the same way on every endpoint: the
token header (`Authorization: Token <key>`, looked up by its digest) for the API, the stream and
/metrics/ alike, and the session (browsers: EventSource sends no headers). Every token attempt is
throttled per client address first (throttles.py): from a blocked address even a valid key is a
429. A good key is answered from the process's token cache (token_cache.py) while no news has come
that could change its answer. The API's DRF authentication class (runs.api.authentication) is
this, inside DRF.
"""

import time
from datetime import timedelta
from typing import Any, cast

from django.db.models import Q
from django.http import HttpRequest
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from rest_framework.authentication import TokenAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from runs.access import AnyUser, User
from runs.http import throttles
from runs.http.token_cache import cache
from runs.models import ApiToken, key_digest
from runs.selectors.credentials import token_with_failure

# How stale a token's `last_used_at` may be: a request writes it only when it is older, so a busy
# token costs one UPDATE a minute, not one a request (django-rest-knox refreshes its expiries so).
LAST_USED_EVERY = timedelta(seconds=60)


def _note_used(token: ApiToken) -> bool:
    """The authentication's own bookkeeping, as the throttle's failures are (no service may be
    imported here): the token's last use, at most once per LAST_USED_EVERY; whether it wrote."""
    now = timezone.now()
    if token.last_used_at is not None and now - token.last_used_at < LAST_USED_EVERY:
        return False
    # Conditional, so that a burst of requests that all read it stale write it once.
    stale = Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - LAST_USED_EVERY)
    ApiToken.objects.filter(stale, pk=token.pk).update(last_used_at=now)
    token.last_used_at = now
    return True


class _Tokens(TokenAuthentication):
    """DRF's token scheme (its header parsing and messages; the tokens are runs.models.ApiToken),
    with the key looked up together with its address's standing (runs.http.throttles): one
    statement for a good key, where a check before the look-up was a second."""

    def __init__(self, block: throttles.TokenBlock | None) -> None:
        self.block = block

    def authenticate_credentials(self, key: str) -> tuple[Any, Any]:
        # Kept per address: an entry says the address was not blocked when it was read, and every
        # failure from it since drops it (a blocked address is only read, never remembered).
        cached = (key_digest(key), self.block.key if self.block else "")
        token = cache.get(cached)
        if token is not None and token.expires_at is not None and token.expires_at <= timezone.now():
            token = None  # expired: read, and refused, as any unknown key
        if token is not None:
            if _note_used(token):
                cache.noted_use(cached, token)
            return token.user, token
        epoch, read_at = cache.begin(), time.monotonic()
        token, nth_failure = token_with_failure(key=key, failures=self.block.failures if self.block else None)
        if token is None:
            raise AuthenticationFailed(_("Invalid token."))
        if self.block is not None:
            throttles.refuse_blocked(self.block, nth_failure)
        if not token.user.is_active:
            raise AuthenticationFailed(_("User inactive or deleted."))
        _note_used(token)
        cache.keep(epoch, cached, token, read_at=read_at)
        return token.user, token


def token_credentials(request: HttpRequest) -> tuple[Any, Any] | None:
    """(user, token) of the request's token header; None without one. A bad token raises DRF's
    `AuthenticationFailed`, a blocked address `TooManyRequests` (a valid key too, or a guesser
    who hits one would go on)."""
    # DRF's scheme reads the header through DRF's request type.
    wrapped = Request(request)
    words = get_authorization_header(wrapped).split()
    if not words or words[0].lower() != TokenAuthentication.keyword.lower().encode():
        return None  # not a token attempt
    address = throttles.client_address(request)
    try:
        return _Tokens(throttles.token_block(address=address)).authenticate(wrapped)
    except AuthenticationFailed:
        # A malformed header fails here too: it is an attempt at a token all the same. Blocked
        # or not is learnt only now for a key that is no token; refused the same, uncounted.
        throttles.auth_token_check(address=address)
        throttles.auth_token_failed(address=address)
        raise


def request_credentials(request: HttpRequest) -> tuple[User, int | None, str | None] | None:
    """The token header, else the session: (user, token id, session key), one of the two set;
    None when neither authenticates. A bad token is not silently downgraded to the session."""
    try:
        found = token_credentials(request)
    except AuthenticationFailed:
        return None
    if found is not None:
        return cast(User, found[0]), int(found[1].pk), None
    user = cast(AnyUser, request.user)
    return (user, None, request.session.session_key) if isinstance(user, User) and user.is_authenticated else None
