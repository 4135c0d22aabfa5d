"""How programs authenticate with the API (docs/design/api.md#authentication): DRF's token header
(`Authorization: Token <key>`), read and throttled exactly as on every other endpoint
(runs.http.authentication), inside DRF."""

from typing import Any

from rest_framework import authentication
from rest_framework.request import Request

from runs.http.authentication import token_credentials


class TokenAuthentication(authentication.TokenAuthentication):
    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        return token_credentials(request._request)
