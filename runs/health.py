"""Load-balancer probes: public, JSON, no session. GET or HEAD (`require_safe`): load balancers
probe with either, and a HEAD answers the same status and headers without the body."""

import logging

from django.db import DatabaseError, connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_safe

from runs.http.errors import error_body

logger = logging.getLogger(__name__)


@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    """The process is alive; says nothing about the database."""
    return JsonResponse({"status": "ok"})


@require_safe
def readyz(request: HttpRequest) -> JsonResponse:
    """The database answers. The connect timeout is short (settings), so a dead database is a
    prompt 503, not a hung probe."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError as exc:
        # The driver's message names hosts and ports: it goes to the log, not to the public probe.
        logger.warning("readyz: database unavailable: %s", str(exc).splitlines()[0] if str(exc) else exc)
        body = {"status": "unavailable", **error_body("database_unavailable", "the database is unavailable")}
        return JsonResponse(body, status=503)
    return JsonResponse({"status": "ok", "database": connection.vendor})
