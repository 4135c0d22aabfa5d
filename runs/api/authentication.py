"""How programs authenticate: DRF's token header (`Authorization: Token <key>`), for the API and
the SSE stream alike (DESIGN §6)."""

from rest_framework import authentication


class TokenAuthentication(authentication.TokenAuthentication):
    pass
