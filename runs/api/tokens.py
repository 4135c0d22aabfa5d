"""`/api/tokens/`: the caller's own API tokens — issued (the key in that answer only), listed
(never a key), revoked (docs/design/api.md#tokens)."""

from datetime import timedelta
from typing import Any

from django.urls import path
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from runs.api.apis import _caller, _page_of, _valid
from runs.api.base import ApiView
from runs.api.filters import page_filter
from runs.api.objects import Operations
from runs.models import ApiToken
from runs.selectors.credentials import tokens_of
from runs.services import MAX_LIFETIME, token_create, token_delete
from runs.services.tokens import NAME, NAME_RULE

TOKEN_NAME = OpenApiParameter(
    "name",
    OpenApiTypes.STR,
    OpenApiParameter.PATH,
    pattern=f"^{NAME.pattern}$",
    description="the token's name; an unknown one (or one no token could have) is a 404",
)


@extend_schema_serializer(component_name="ApiToken")
class TokenOutputSerializer(serializers.Serializer[ApiToken]):
    name = serializers.CharField()
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(allow_null=True, help_text="null: never")
    last_used_at = serializers.DateTimeField(
        allow_null=True, help_text="null: never used; moved at most once a minute, so up to a minute behind"
    )
    issued_by = serializers.CharField(
        source="issued_by.name",
        allow_null=True,
        help_text="the token whose request issued this one (which it expires no later than, and is revoked with), "
        "or null",
    )


@extend_schema_serializer(component_name="ApiTokenWithKey")
class TokenKeySerializer(TokenOutputSerializer):
    key = serializers.CharField(help_text="shown only in this answer: send it as `Authorization: Token <key>`")


TokenPageSerializer = _page_of(TokenOutputSerializer, "ApiTokenPage", "API tokens")


@extend_schema_serializer(component_name="ApiTokenCreateInput")
class CreateInput(serializers.Serializer[Any]):
    """A new token: a `name`, and at most one of `expires_in` and `expires_at` (neither: it never
    expires — unless the request came with a token that does)."""

    name = serializers.CharField(max_length=64, help_text=NAME_RULE)
    expires_in = serializers.IntegerField(
        min_value=60,
        max_value=int(MAX_LIFETIME.total_seconds()),
        required=False,
        help_text="seconds from now until it expires",
    )
    expires_at = serializers.DateTimeField(required=False, help_text="when it expires (ISO 8601)")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(self.initial_data.get("name"), str):  # DRF's CharField takes 7 for "7"
            raise serializers.ValidationError({"name": ["must be a string"]})
        if "expires_in" in attrs and "expires_at" in attrs:
            raise serializers.ValidationError({"expires_at": ["give expires_in or expires_at, not both"]})
        return attrs


LIST_DOC = "Oldest first, paged by cursor: names, expiries, creation and last use — never a key."
CREATE_DOC = (
    "201 with the token and its `key`, shown only here: Runledger keeps the key's SHA-256 digest, never the key. "
    "A request that came with a token issues one that expires no later than that token (its expiry when none is "
    "given) and is revoked with it; a session (a browser) may issue any. A name already held is a 400; past "
    "RUNLEDGER_MAX_TOKENS_PER_USER tokens, a 429."
)


_operation = Operations("tokens", TOKEN_NAME, page_filter("ApiTokenPageFilter", "A page of the caller's tokens."))


class TokenApi(ApiView):
    """A key, or a list of what exists: no cache keeps either."""

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        response = super().finalize_response(request, response, *args, **kwargs)
        response["Cache-Control"] = "no-store"
        return response


class TokenCollectionApi(TokenApi):
    get = _operation.list("List your API tokens", LIST_DOC, TokenPageSerializer, tokens_of, ["created_at", "id"])

    @_operation.create("Issue an API token", TokenKeySerializer, 403, request=CreateInput, description=CREATE_DOC)
    def post(self, request: Request) -> Response:
        data = _valid(CreateInput, request.data)
        expires_at = data.get("expires_at")
        if "expires_in" in data:
            expires_at = timezone.now() + timedelta(seconds=data["expires_in"])
        # DRF's request.auth: the token the request came with (None: the session).
        issued_by = request.auth if isinstance(request.auth, ApiToken) else None
        token, key = token_create(user=_caller(request), name=data["name"], expires_at=expires_at, issued_by=issued_by)
        return Response({**TokenOutputSerializer(token).data, "key": key}, status=201)


class TokenDetailApi(TokenApi):
    @_operation.destroy(
        "Revoke an API token",
        "At once, with the tokens it issued: a request with it is a 401 from now on, and the streams it opened end.",
    )
    def delete(self, request: Request, name: str) -> Response:
        token_delete(user=_caller(request), name=name)
        return Response(status=204)


# Mounted at /api/tokens/ (runs/api/urls.py).
urlpatterns = [
    path("", TokenCollectionApi.as_view(), name="token-collection"),
    path("<str:name>/", TokenDetailApi.as_view(), name="token-detail"),
]
