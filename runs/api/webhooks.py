"""`/api/webhooks/`: the caller's webhook endpoints, their secret's rotation and their deliveries
(docs/design/webhooks.md#endpoints)."""

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from runs.api.apis import _caller, _page_of, _valid
from runs.api.base import ApiView
from runs.api.filters import PageFilterSerializer
from runs.api.pagination import page_size, paged_response, queryset_page
from runs.api.schema import documented, responses
from runs.events import WEBHOOK_EVENTS
from runs.models import WebhookDelivery, WebhookEndpoint
from runs.selectors.webhooks import webhook_deliveries, webhooks_visible
from runs.services.webhook_endpoints import (
    webhook_create,
    webhook_delete,
    webhook_of,
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
    url = serializers.URLField(max_length=2000, help_text="http(s); a public address (checked again at each delivery)")
    events = serializers.ListField(child=serializers.ChoiceField(choices=list(WEBHOOK_EVENTS)), help_text=EVENTS_HELP)
    metadata = serializers.DictField(required=False, help_text=METADATA_HELP)
    all_runs = serializers.BooleanField(required=False, help_text=ALL_RUNS_HELP)
    enabled = serializers.BooleanField(required=False)


EndpointPageSerializer = _page_of(EndpointOutputSerializer, "WebhookEndpointPage", "webhook endpoints")
DeliveryPageSerializer = _page_of(DeliveryOutputSerializer, "WebhookDeliveryPage", "webhook deliveries")


class WebhookCollectionApi(ApiView):
    @extend_schema_serializer(component_name="WebhookCreateInput")
    class InputSerializer(_ChangeSerializer):
        pass

    @extend_schema_serializer(component_name="WebhookListFilter")
    class FilterSerializer(PageFilterSerializer):
        pass

    @documented(
        operation_id="webhooks_list",
        summary="List your webhook endpoints",
        description="Oldest first, paged by cursor; staff with runs.change_run see everyone's.",
        parameters=[FilterSerializer],
        responses=responses({200: EndpointPageSerializer}, 400),
    )
    def get(self, request: Request) -> Response:
        data = _valid(self.FilterSerializer, request.query_params)
        endpoints = webhooks_visible(user=_caller(request)).select_related("owner")
        page = queryset_page(
            endpoints, ordering=["created_at", "id"], cursor=data.get("cursor"), size=page_size(data.get("page_size"))
        )
        return paged_response(page, serializer_class=EndpointOutputSerializer, request=request)

    @documented(
        operation_id="webhooks_create",
        summary="Register a webhook endpoint",
        description="201 with the endpoint and its signing `secret` (`whsec_…`), shown only here. A URL that is "
        "not http(s), or whose host is or resolves to a loopback, private, link-local or metadata address, is "
        "a 400 naming `url` (unless RUNLEDGER_WEBHOOKS_ALLOW_PRIVATE). `all_runs` without runs.view_run is a 403.",
        request=InputSerializer,
        responses=responses({201: EndpointSecretSerializer}, 400, 403, 413, 415),
    )
    def post(self, request: Request) -> Response:
        data = _valid(self.InputSerializer, request.data)
        endpoint = webhook_create(owner=_caller(request), **data)
        return Response(_out(endpoint, secret=True), status=201)


class WebhookDetailApi(ApiView):
    @extend_schema_serializer(component_name="WebhookUpdateInput")
    class InputSerializer(_ChangeSerializer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, partial=True, **kwargs)

    @documented(
        operation_id="webhooks_retrieve",
        summary="Read a webhook endpoint",
        parameters=[ENDPOINT_ID],
        responses=responses({200: EndpointOutputSerializer}, 404),
    )
    def get(self, request: Request, webhook_id: str) -> Response:
        return Response(_out(webhook_of(endpoint_id=webhook_id, user=_caller(request))))

    @documented(
        operation_id="webhooks_update",
        summary="Change a webhook endpoint",
        description="Any of `url`, `events`, `metadata`, `all_runs`, `enabled`; enabling it again clears its "
        "`disabled_reason` and its failures so far.",
        parameters=[ENDPOINT_ID],
        request=InputSerializer,
        responses=responses({200: EndpointOutputSerializer}, 400, 403, 404, 413, 415),
    )
    def patch(self, request: Request, webhook_id: str) -> Response:
        user = _caller(request)
        webhook_of(endpoint_id=webhook_id, user=user)  # an invisible endpoint is a 404 before a bad body's 400
        data = _valid(self.InputSerializer, request.data)
        return Response(_out(webhook_update(endpoint_id=webhook_id, user=user, changes=data)))

    @documented(
        operation_id="webhooks_destroy",
        summary="Delete a webhook endpoint",
        description="With its deliveries: pending ones are not sent.",
        parameters=[ENDPOINT_ID],
        responses=responses({204: None}, 404),
    )
    def delete(self, request: Request, webhook_id: str) -> Response:
        webhook_delete(endpoint_id=webhook_id, user=_caller(request))
        return Response(status=204)


class WebhookRotateSecretApi(ApiView):
    @documented(
        operation_id="webhooks_rotate_secret",
        summary="Rotate a webhook endpoint's signing secret",
        description="200 with the endpoint and its new `secret`, shown only here. Deliveries are signed with the "
        "old secret too until `previous_secret_expires_at` (RUNLEDGER_WEBHOOKS_ROTATION_OVERLAP_SECONDS), so "
        "receivers can switch without losing a request.",
        parameters=[ENDPOINT_ID],
        request=None,
        responses=responses({200: EndpointSecretSerializer}, 404),
    )
    def post(self, request: Request, webhook_id: str) -> Response:
        return Response(_out(webhook_rotate_secret(endpoint_id=webhook_id, user=_caller(request)), secret=True))


class WebhookDeliveriesApi(ApiView):
    @extend_schema_serializer(component_name="WebhookDeliveriesFilter")
    class FilterSerializer(PageFilterSerializer):
        pass

    @documented(
        operation_id="webhooks_deliveries",
        summary="List a webhook endpoint's deliveries",
        description="Newest first, paged by cursor: each notification, its status and its attempts so far.",
        parameters=[ENDPOINT_ID, FilterSerializer],
        responses=responses({200: DeliveryPageSerializer}, 400, 404),
    )
    def get(self, request: Request, webhook_id: str) -> Response:
        endpoint = webhook_of(endpoint_id=webhook_id, user=_caller(request))
        data = _valid(self.FilterSerializer, request.query_params)
        page = queryset_page(
            webhook_deliveries(endpoint=endpoint),
            ordering=["-created_at", "-id"],
            cursor=data.get("cursor"),
            size=page_size(data.get("page_size")),
        )
        return paged_response(page, serializer_class=DeliveryOutputSerializer, request=request)
