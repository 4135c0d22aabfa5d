"""What a view has called once its request has surely ended, whatever happened to it
(docs/design/streaming.md#guard): a stream's slot, given back even when the client left before the
stream's body ever ran. The view registers with `at_request_end` in its ASGI scope or WSGI environ;
the app's ASGI wrapper (asgi.py) or, under WSGI, the stream's relay (runs.streaming.responses) calls
it (`request_ended`). Django's own ASGI handler calls nothing here: whatever registers must also be
given back another way.
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
