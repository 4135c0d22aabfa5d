"""Who a request is (docs/design/api.md#authentication), read the same way on every endpoint: DRF's
token header (`Authorization: Token <key>`, programs) for the API, the stream and /metrics/ alike,
and the session (browsers: EventSource sends no headers).

Every token attempt is throttled per client address (runs.http.throttles): a request that carries
a token header from an address with too many recent failures is refused with `TooManyRequests`
(429) before its key is looked up — a valid key too, or a guesser who hits one would go on — and a
failed one is counted. Requests without a token header (the session) are neither checked nor
counted. The API's DRF authentication class (runs.api.authentication) is this, inside DRF.
"""

from typing import Any, cast

from django.http import HttpRequest
from rest_framework.authentication import TokenAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from runs.access import AnyUser, User
from runs.http import throttles

# DRF's token scheme (its header, key look-up and messages): the tokens are DRF's authtoken rows.
_TOKENS = TokenAuthentication()


def token_credentials(request: HttpRequest) -> tuple[Any, Any] | None:
    """(user, token) of the request's token header; None without one. A bad token raises DRF's
    `AuthenticationFailed`, a blocked address `TooManyRequests`."""
    # DRF's scheme reads the header through DRF's request type.
    wrapped = Request(request)
    words = get_authorization_header(wrapped).split()
    if not words or words[0].lower() != _TOKENS.keyword.lower().encode():
        return None  # not a token attempt
    address = throttles.client_address(request)
    throttles.auth_token_check(address=address)
    try:
        return _TOKENS.authenticate(wrapped)
    except AuthenticationFailed:
        # A malformed header fails here too: it is an attempt at a token all the same.
        throttles.auth_token_failed(address=address)
        raise


def request_credentials(request: HttpRequest) -> tuple[User, str | None, str | None] | None:
    """The token header, else the session: (user, token key, session key), one of the keys set;
    None when neither authenticates. A bad token is not silently downgraded to the session."""
    try:
        found = token_credentials(request)
    except AuthenticationFailed:
        return None
    if found is not None:
        return cast(User, found[0]), found[1].key, None
    user = cast(AnyUser, request.user)
    return (user, None, request.session.session_key) if isinstance(user, User) and user.is_authenticated else None
