"""What a view has called once its request has surely ended, whatever happened to it: a stream's
slot of its user's cap, given back even when the client left before the stream's body ever ran
(an unstarted async generator runs no `finally`).

The view registers with `at_request_end`, in what the server handed the request: its ASGI scope,
or under a WSGI server its environ. Once the request is over, the app's ASGI wrapper (runs.asgi)
calls what was registered in the scope, and under WSGI the stream's own relay
(runs.streaming.responses) what was registered in the environ (`request_ended`). Django's own ASGI
handler calls nothing here: whatever registers must also be given back another way
(runs.streaming.guard says how).
"""

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest

# The key, in the ASGI scope or the WSGI environ, under which a request lists what to call once it has ended.
REQUEST_END = "runledger.request_end"


def at_request_end(request: HttpRequest, call: Callable[[], None]) -> None:
    """Have `call` called when the request has ended, whatever happened to it."""
    scope: dict[str, Any] | None = getattr(request, "scope", None)
    held = request.META if scope is None else scope
    held.setdefault(REQUEST_END, []).append(call)


def request_ended(held: dict[str, Any]) -> None:
    """Call what the request (whose ASGI scope or WSGI environ is `held`) registered."""
    for call in held.pop(REQUEST_END, ()):
        call()
