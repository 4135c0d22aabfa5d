"""What a view has called once its request has surely ended, whatever happened to it: a stream's
slot of its user's cap, given back even when the client left before the stream's body ever ran
(an unstarted async generator runs no `finally`).

The view registers with `at_request_end`; the app's ASGI wrapper (runs.asgi) calls what was
registered once the request is over (`request_ended`). Django's own handler calls nothing here:
whatever registers must also be given back another way (runs.streaming.guard says how).
"""

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest

# The ASGI scope key under which a request lists what to call once it has ended.
REQUEST_END = "runledger.request_end"


def at_request_end(request: HttpRequest, call: Callable[[], None]) -> None:
    """Have `call` called when the request has ended, whatever happened to it."""
    request.scope.setdefault(REQUEST_END, []).append(call)  # type: ignore[attr-defined]


def request_ended(scope: dict[str, Any]) -> None:
    for call in scope.get(REQUEST_END, ()):
        call()
