"""What every view of the API is, whatever the host project's `REST_FRAMEWORK` says
(docs/design/api.md#authentication): token and session authentication, authenticated callers only,
JSON in (the storable-checking parser) and out, errors in the API's shape, no throttles of DRF's
(the app's limits are its own), and drf-spectacular's schema. A host's REST_FRAMEWORK governs its
own APIs, never these.
"""

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponseBase
from drf_spectacular.openapi import AutoSchema
from rest_framework.authentication import BaseAuthentication, SessionAuthentication
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.parsers import BaseParser
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.throttling import BaseThrottle
from rest_framework.versioning import BaseVersioning
from rest_framework.views import APIView

from runs.api.authentication import TokenAuthentication
from runs.api.errors import exception_handler
from runs.api.parsers import JSONParser


class ApiView(APIView):
    authentication_classes: list[type[BaseAuthentication]] = [TokenAuthentication, SessionAuthentication]
    permission_classes: list[type[BasePermission]] = [IsAuthenticated]
    parser_classes: list[type[BaseParser]] = [JSONParser]
    renderer_classes: list[type[BaseRenderer]] = [JSONRenderer]
    throttle_classes: list[type[BaseThrottle]] = []
    content_negotiation_class = DefaultContentNegotiation
    versioning_class: type[BaseVersioning] | None = None
    schema = AutoSchema()

    def get_exception_handler(self) -> Callable[[Exception, dict[str, Any]], Any]:
        return exception_handler

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        response = super().dispatch(request, *args, **kwargs)
        # DRF keeps the answer on the view, and the view is in a cycle with its Request (the
        # parser context names it), freed only when the collector runs — seldom in a web process
        # (runs/asgi.py): each big events page would stay in memory until then.
        del self.response
        return response
