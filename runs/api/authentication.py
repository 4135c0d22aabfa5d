"""How programs authenticate: DRF's token header (`Authorization: Token <key>`), for the API and
the SSE stream alike (DESIGN §6), with failed attempts throttled per client address.

A request that carries a token header from an address with too many recent failures is refused
with `TooManyRequests` (429) before its key is looked up — a valid key too, or a guesser who hits
one would go on. Requests without a token header (the session) are neither checked nor counted.
"""

from typing import Any

from rest_framework import authentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from runs import services


class TokenAuthentication(authentication.TokenAuthentication):
    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        words = authentication.get_authorization_header(request).split()
        if not words or words[0].lower() != self.keyword.lower().encode():
            return None  # not a token attempt
        address = services.client_address(request._request)
        services.auth_token_check(address=address)
        try:
            return super().authenticate(request)
        except AuthenticationFailed:
            # A malformed header fails here too: it is an attempt at a token all the same.
            services.auth_token_failed(address=address)
            raise
