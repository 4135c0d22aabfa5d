"""Where a request's synchronous steps run: a middleware and a `request_started` receiver that note
the thread of each (runs/http/middleware.py); and requests to an ASGI app in this process."""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from asgiref.testing import ApplicationCommunicator
from django.core import signals
from django.http import HttpRequest, HttpResponseBase
from django.utils.deprecation import MiddlewareMixin

# (step, thread name), in the order they ran.
SEEN: list[tuple[str, str]] = []


def _note(step: str) -> None:
    SEEN.append((step, threading.current_thread().name))


class ThreadsSeen(MiddlewareMixin):
    """A plain middleware, as a site's own would be: notes the thread of each of its methods."""

    def process_request(self, request: HttpRequest) -> None:
        _note("process_request")

    def process_response(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        _note("process_response")
        return response


def _started(**kwargs: Any) -> None:
    _note("request_started")


@contextmanager
def noting_threads() -> Iterator[list[tuple[str, str]]]:
    """SEEN, emptied, with Django's `request_started` noted too while the block runs."""
    SEEN.clear()
    signals.request_started.connect(_started, weak=False)
    try:
        yield SEEN
    finally:
        signals.request_started.disconnect(_started)


def http_scope(method: str, path: str, query: bytes, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    """The ASGI scope of an HTTP/1.1 request from a loopback client."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "root_path": "",
        "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }


async def answer_head(app: Any, path: str, query: bytes, headers: list[tuple[bytes, bytes]]) -> int:
    """GET `path` from the ASGI `app` in this process: the answer's status, read from its head; the
    client then leaves (a stream's body is never read)."""
    talk = ApplicationCommunicator(app, http_scope("GET", path, query, headers))
    await talk.send_input({"type": "http.request", "body": b""})
    start = await talk.receive_output(10)
    await talk.send_input({"type": "http.disconnect"})
    await talk.wait(10)
    return int(start["status"])
