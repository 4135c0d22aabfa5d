"""`GET /metrics/` (docs/design/operations.md#metrics): Prometheus's text format, for the metrics
bearer token or a user who sees every run (`runs.view_run`), by session or API token.

Each scrape builds a registry of its own: every process's counters from the shared directory
(`MultiProcessCollector`) and the state gauges from the database.
"""

import hmac

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from rest_framework.exceptions import AuthenticationFailed

from runs import access
from runs.conf import conf
from runs.exceptions import TooManyRequests
from runs.http import throttles
from runs.http.authentication import token_credentials
from runs.http.errors import error_response, error_response_for
from runs.metrics import store
from runs.metrics.database import DatabaseCollector


def _refusal(request: HttpRequest) -> HttpResponse | None:
    """None when the caller may read the metrics; else the answer. Never a redirect to a login
    page: Prometheus (and any program) needs a status it can alert on."""
    header = request.headers.get("Authorization", "")
    scheme, _, credential = header.partition(" ")
    if scheme.lower() == "bearer":
        # A bearer credential is judged alone: a wrong one is not downgraded to the session. It is
        # a token attempt like the API's, counted and refused per client address with them, so the
        # metrics token cannot be guessed faster than an API token.
        address = throttles.client_address(request)
        try:
            throttles.auth_token_check(address=address)
        except TooManyRequests as exc:
            return error_response_for(exc)
        expected = conf.METRICS_TOKEN
        if expected and hmac.compare_digest(credential.strip().encode(), expected.encode()):
            return None
        throttles.auth_token_failed(address=address)
        return _unauthenticated("the metrics token is not valid")
    try:
        found = token_credentials(request)
    except AuthenticationFailed as exc:
        return _unauthenticated(str(exc.detail))
    except TooManyRequests as exc:  # this address failed too often (runs.http.throttles)
        return error_response_for(exc)
    user = found[0] if found is not None else request.user
    if not user.is_authenticated:
        return _unauthenticated("authentication credentials were not provided")
    if not access.sees_every_run(user):
        return error_response(403, "permission_denied", "reading the metrics needs the runs.view_run permission")
    return None


def _unauthenticated(message: str) -> HttpResponse:
    response = error_response(401, "not_authenticated", message)
    response["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return response


@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    refused = _refusal(request)
    if refused is not None:
        return refused
    store.install()  # the directory exists, whatever this process has counted so far
    store.forget_dead()
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=store.directory())
    registry.register(DatabaseCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
