"""`/api/webhooks/`: the caller's webhook endpoints, their secret's rotation and their deliveries
(docs/design/webhooks.md#endpoints)."""

from typing import Any

from django.contrib.auth.models import AbstractUser
from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from runs.api.apis import _caller, _caller_and_body, _page_of, _valid
from runs.api.base import ApiView
from runs.api.filters import page_filter
from runs.api.objects import Operations, object_urls
from runs.api.pagination import queryset_response
from runs.api.serializers import PartialInput
from runs.events import WEBHOOK_EVENTS
from runs.models import WebhookDelivery, WebhookEndpoint
from runs.selectors.webhooks import webhook_deliveries, webhook_get, webhooks_visible
from runs.services import (
    webhook_create,
    webhook_delete,
    webhook_rotate_secret,
    webhook_update,
)

ENDPOINT_ID = OpenApiParameter(
    "webhook_id", OpenApiTypes.UUID, OpenApiParameter.PATH, description="the endpoint's id; a malformed id is a 404"
)
EVENTS_HELP = f"any of {', '.join(WEBHOOK_EVENTS)}"
METADATA_HELP = "sent only runs whose metadata holds all these labels (key: value)"
ALL_RUNS_HELP = "every owner's runs, not only yours: needs runs.view_run"


@extend_schema_serializer(component_name="WebhookEndpoint")
class EndpointOutputSerializer(serializers.Serializer[WebhookEndpoint]):
    id = serializers.UUIDField()
    url = serializers.URLField()
    events = serializers.ListField(child=serializers.ChoiceField(choices=list(WEBHOOK_EVENTS)))
    metadata = serializers.DictField(child=serializers.CharField(allow_blank=True), help_text=METADATA_HELP)
    all_runs = serializers.BooleanField(help_text=ALL_RUNS_HELP)
    enabled = serializers.BooleanField()
    disabled_reason = serializers.CharField(
        allow_blank=True, help_text="why Runledger disabled it (every delivery failing for long); empty otherwise"
    )
    failing_since = serializers.DateTimeField(allow_null=True, help_text="since when every attempt fails, or null")
    owner = serializers.CharField(source="owner.username")
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    previous_secret_expires_at = serializers.DateTimeField(
        allow_null=True, help_text="until then deliveries are signed with the rotated-out secret too"
    )


@extend_schema_serializer(component_name="WebhookEndpointWithSecret")
class EndpointSecretSerializer(EndpointOutputSerializer):
    secret = serializers.CharField(help_text="`whsec_…`: shown only in this answer; verify signatures with it")


@extend_schema_serializer(component_name="WebhookDelivery")
class DeliveryOutputSerializer(serializers.Serializer[WebhookDelivery]):
    id = serializers.CharField(source="webhook_id", help_text="the `webhook-id` of every attempt")
    run_id = serializers.UUIDField()
    seq = serializers.IntegerField(help_text="the event's seq in the run")
    event_type = serializers.CharField()
    status = serializers.ChoiceField(choices=["pending", "delivered", "failed"])
    attempts = serializers.IntegerField()
    next_attempt_at = serializers.DateTimeField()
    created_at = serializers.DateTimeField()
    delivered_at = serializers.DateTimeField(allow_null=True)
    last_error = serializers.CharField(allow_blank=True)


def _out(endpoint: WebhookEndpoint, *, secret: bool = False) -> dict[str, Any]:
    return dict((EndpointSecretSerializer if secret else EndpointOutputSerializer)(endpoint).data)


class _ChangeSerializer(serializers.Serializer[Any]):
    url = serializers.URLField(
        max_length=2000,
        help_text="http(s); a public address (a name is checked at each delivery, on what it resolves to)",
    )
    events = serializers.ListField(child=serializers.ChoiceField(choices=list(WEBHOOK_EVENTS)), help_text=EVENTS_HELP)
    metadata = serializers.DictField(required=False, help_text=METADATA_HELP)
    all_runs = serializers.BooleanField(required=False, help_text=ALL_RUNS_HELP)
    enabled = serializers.BooleanField(required=False)


PageFilter = page_filter("WebhookPageFilter", "A page of endpoints, or of one endpoint's deliveries.")


@extend_schema_serializer(component_name="WebhookCreateInput")
class CreateInput(_ChangeSerializer):
    """A new endpoint: `url` and `events` required."""


@extend_schema_serializer(component_name="WebhookUpdateInput")
class UpdateInput(PartialInput, _ChangeSerializer):
    """Any of the fields, each optional."""


_operation = Operations("webhooks", ENDPOINT_ID, PageFilter)


EndpointPageSerializer = _page_of(EndpointOutputSerializer, "WebhookEndpointPage", "webhook endpoints")
DeliveryPageSerializer = _page_of(DeliveryOutputSerializer, "WebhookDeliveryPage", "webhook deliveries")


LIST_DOC = "Oldest first, paged by cursor; staff with runs.change_run see everyone's."
CREATE_DOC = (
    "201 with the endpoint and its signing `secret` (`whsec_…`), shown only here. A URL that is not http(s), or "
    "whose host is written as a loopback, private, link-local or metadata address, is a 400 naming `url` (unless "
    "RUNLEDGER_WEBHOOKS_ALLOW_PRIVATE); a name is not resolved here, but at each delivery. `all_runs` without "
    "runs.view_run is a 403. A user with RUNLEDGER_MAX_WEBHOOKS_PER_USER endpoints is refused another: 429."
)
UPDATE_DOC = (
    "Any of `url`, `events`, `metadata`, `all_runs`, `enabled`; enabling it again clears its `disabled_reason` "
    "and its failures so far."
)
ROTATE_DOC = (
    "200 with the endpoint and its new `secret`, shown only here. Deliveries are signed with the old secret too "
    "until `previous_secret_expires_at` (RUNLEDGER_WEBHOOKS_ROTATION_OVERLAP_SECONDS), so receivers can switch "
    "without losing a request."
)


def _with_owner(*, user: AbstractUser) -> QuerySet[WebhookEndpoint]:
    # Each item names its owner.
    return webhooks_visible(user=user).select_related("owner")


class WebhookCollectionApi(ApiView):
    get = _operation.list(
        "List your webhook endpoints", LIST_DOC, EndpointPageSerializer, _with_owner, ["created_at", "id"]
    )

    @_operation.create(
        "Register a webhook endpoint", EndpointSecretSerializer, 403, request=CreateInput, description=CREATE_DOC
    )
    def post(self, request: Request) -> Response:
        endpoint = webhook_create(owner=_caller(request), **_valid(CreateInput, request.data))
        return Response(_out(endpoint, secret=True), status=201)


class WebhookDetailApi(ApiView):
    @_operation("retrieve", "Read a webhook endpoint", {200: EndpointOutputSerializer}, 404)
    def get(self, request: Request, webhook_id: str) -> Response:
        return Response(_out(webhook_get(endpoint_id=webhook_id, user=_caller(request))))

    @_operation(
        "update",
        "Change a webhook endpoint",
        {200: EndpointOutputSerializer},
        400,
        403,
        404,
        413,
        415,
        description=UPDATE_DOC,
        request=UpdateInput,
    )
    def patch(self, request: Request, webhook_id: str) -> Response:
        user, changes = _caller_and_body(request, UpdateInput, webhook_get, endpoint_id=webhook_id)
        return Response(_out(webhook_update(endpoint_id=webhook_id, user=user, changes=changes)))

    @_operation.destroy("Delete a webhook endpoint", "With its deliveries: pending ones are not sent.")
    def delete(self, request: Request, webhook_id: str) -> Response:
        webhook_delete(endpoint_id=webhook_id, user=_caller(request))
        return Response(status=204)


class WebhookRotateSecretApi(ApiView):
    @_operation(
        "rotate_secret",
        "Rotate a webhook endpoint's signing secret",
        {200: EndpointSecretSerializer},
        404,
        description=ROTATE_DOC,
        request=None,
    )
    def post(self, request: Request, webhook_id: str) -> Response:
        return Response(_out(webhook_rotate_secret(endpoint_id=webhook_id, user=_caller(request)), secret=True))


class WebhookDeliveriesApi(ApiView):
    @_operation(
        "deliveries",
        "List a webhook endpoint's deliveries",
        {200: DeliveryPageSerializer},
        400,
        404,
        description="Newest first, paged by cursor: each notification, its status and its attempts so far.",
        parameters=[ENDPOINT_ID, PageFilter],
    )
    def get(self, request: Request, webhook_id: str) -> Response:
        endpoint = webhook_get(endpoint_id=webhook_id, user=_caller(request))
        query = _valid(PageFilter, request.query_params)
        deliveries = webhook_deliveries(endpoint=endpoint)
        return queryset_response(deliveries, ["-created_at", "-id"], query, DeliveryOutputSerializer, request)


# Mounted at /api/webhooks/ (runs/api/urls.py).
urlpatterns = object_urls(
    "webhook",
    WebhookCollectionApi,
    WebhookDetailApi,
    {"rotate-secret": WebhookRotateSecretApi, "deliveries": WebhookDeliveriesApi},
)
