"""The app's OpenAPI schema: the view that serves it on the app's own settings whatever the
project's, the paths it lists, and the error shape documented under each status code
(docs/design/api.md#schema)."""

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.settings import SPECTACULAR_DEFAULTS
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from drf_spectacular.views import SpectacularAPIView
from rest_framework.authentication import BaseAuthentication
from rest_framework.permissions import AllowAny, BasePermission
from rest_framework.request import Request
from rest_framework.response import Response

from runs.api.base import ApiView
from runs.api.schema_settings import SCHEMA_SETTINGS
from runs.api.serializers import ConflictSerializer, ErrorSerializer

F = TypeVar("F", bound=Callable[..., Any])

_ERRORS: dict[int, OpenApiResponse] = {
    400: OpenApiResponse(ErrorSerializer, description="`validation_error`: a malformed body, query or header"),
    401: OpenApiResponse(ErrorSerializer, description="`not_authenticated`: no or bad credentials"),
    403: OpenApiResponse(
        ErrorSerializer, description="`permission_denied`: the run is visible but the action is not allowed"
    ),
    404: OpenApiResponse(ErrorSerializer, description="`not_found`: no such run, or not visible to the caller"),
    409: OpenApiResponse(
        ConflictSerializer,
        description="`invalid_transition`, `stale_ticket` or `budget_exhausted`: the run's committed state "
        "does not allow it; `run` is that state",
    ),
    413: OpenApiResponse(ErrorSerializer, description="`payload_too_large`: the body is over the size limit"),
    415: OpenApiResponse(ErrorSerializer, description="`unsupported_media_type`: send application/json"),
    422: OpenApiResponse(
        ErrorSerializer, description="`idempotency_mismatch`: the Idempotency-Key was used with another body"
    ),
    429: OpenApiResponse(
        ErrorSerializer,
        description="`too_many_requests`: one of your limits (the manual's Fair use page) refuses it for now; "
        "`Retry-After` says when to try again, `detail` which limit and where you are",
    ),
    503: OpenApiResponse(ErrorSerializer, description="`database_unavailable`: retry later"),
}


def responses(success: dict[int, Any], *errors: int) -> dict[int, Any]:
    """`success` plus the error shape for each of `errors` and for 401 and 503, which any
    operation can answer."""
    codes = sorted({401, 503, *errors})
    return {**success, **{code: _ERRORS[code] for code in codes}}


RUN_ID = OpenApiParameter(
    "run_id", OpenApiTypes.UUID, OpenApiParameter.PATH, description="the run's id; a malformed id is a 404"
)

IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    str,
    OpenApiParameter.HEADER,
    required=False,
    description="Retry-safe create: a retry with the same key and the same JSON body within 24 h answers "
    "the first success again (and creates nothing); another body is a 422. Up to 255 printable ASCII "
    "characters, scoped to the caller.",
)

IDEMPOTENT_REPLAYED = OpenApiParameter(
    "Idempotent-Replayed",
    str,
    OpenApiParameter.HEADER,
    response=[201],
    description="`true` when the response is the stored first answer to this Idempotency-Key",
)


def the_apps_endpoints(endpoints: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Of the project's endpoints (path, regex, method, view), the app's."""
    return [e for e in endpoints if getattr(e[3], "cls", e[3]).__module__.startswith("runs.")]


def served_below_the_script_prefix(result: dict[str, Any], request: Request | None, **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: a site served below a path of its own (a proxy's
    SCRIPT_NAME, uvicorn's --root-path, FORCE_SCRIPT_NAME) has its paths there, which the URLconf's
    leave out; without one, no `servers`: the paths are from the root of the schema's host."""
    below = (request.META.get("SCRIPT_NAME", "") if request is not None else "").rstrip("/")
    if below:
        result["servers"] = [{"url": below}]
    return result


def documented(**kwargs: Any) -> Callable[[F], F]:
    """drf-spectacular's `extend_schema` for a view's method, on drf-spectacular's AutoSchema
    whatever the project's DEFAULT_SCHEMA_CLASS (which `extend_schema` would otherwise build on)."""

    def decorator(method: F) -> F:
        method.kwargs = {"schema": AutoSchema}  # type: ignore[attr-defined]
        return extend_schema(**kwargs)(method)

    return decorator


# Every drf-spectacular setting that shapes a schema, at its default where the app sets none: a
# project's SPECTACULAR_SETTINGS, for its own APIs (a path prefix trimmed or inserted, servers, hooks,
# whitelists, camelized names), changes nothing of the app's. The UI pages' settings stay the
# project's; drf-spectacular takes SERVE_* and the generator class only as the view's attributes.
ISOLATED_SETTINGS: dict[str, Any] = {
    name: value
    for name, value in SPECTACULAR_DEFAULTS.items()
    if not name.startswith(("SERVE_", "SWAGGER_UI_", "REDOC_")) and name != "DEFAULT_GENERATOR_CLASS"
} | SCHEMA_SETTINGS

# drf-spectacular patches its one settings object for the time of a request and puts back what it
# found: two schema requests at once would each find the other's patch, and the second to end
# would leave the app's settings in place of the project's.
_patching = threading.Lock()


class SchemaApi(SpectacularAPIView, ApiView):
    """The schema, public like the health probes (credentials sent to it are ignored), not listing
    itself: the app's operations wherever the project mounted them. drf-spectacular's renderers, the
    API's other behaviour (no throttle, no versioning, the error shape) whatever the project's."""

    custom_settings = ISOLATED_SETTINGS
    generator_class = SchemaGenerator
    serve_public = True
    urlconf = None
    patterns = None
    api_version = None
    authentication_classes: list[type[BaseAuthentication]] = []
    permission_classes: list[type[BasePermission]] = [AllowAny]
    schema = AutoSchema()

    @documented(exclude=True)
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        with _patching:
            return super().get(request, *args, **kwargs)
