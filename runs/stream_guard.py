"""Fair use of the streams a web process serves itself (DESIGN §5, §6): the per-user cap.

A stream that passed its checks is admitted by `StreamGuard.admit`, which counts it against its
user's `RUNLEDGER_MAX_STREAMS_PER_USER` in this process, or refuses it (the view answers 429). The
count is checked and taken in one step on the event loop, with no await in between, so a burst of
opens cannot all slip under the cap. It is given back exactly once (`Watch.release`), by the
stream's body when it ends — or, for a client that left before the body ever ran (an unstarted
async generator never runs its `finally`), when the request ends: config/asgi.py's handler for
async views calls what `release_at_request_end` registered.
"""

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from django.http import HttpRequest

from runs import streams
from runs.limits import limit

# The ASGI scope key under which a request lists what to call once it has ended (config/asgi.py).
REQUEST_END = "runledger.request_end"


def release_at_request_end(request: HttpRequest, release: Callable[[], None]) -> None:
    """Have `release` called when the request has ended, whatever happened to it."""
    request.scope.setdefault(REQUEST_END, []).append(release)  # type: ignore[attr-defined]


@dataclass(eq=False, slots=True)  # eq=False: each is itself, in the guard's set
class Watch:
    """One admitted stream: its user's slot."""

    guard: "StreamGuard"
    user_id: int
    run_id: str
    released: bool = False

    def release(self) -> None:
        """Give the user's slot back; once, however many of the ways to end a stream call it."""
        self.guard.release(self)


class StreamGuard:
    """The streams one event loop (one web process) holds, counted per user."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.counts: dict[int, int] = {}

    def admit(self, *, user_id: int, run_id: str) -> Watch | None:
        """Count a new stream of the user, or None when the user already holds the cap."""
        cap = limit("RUNLEDGER_MAX_STREAMS_PER_USER")
        held = self.counts.get(user_id, 0)
        if cap is not None and held >= cap:
            return None
        self.counts[user_id] = held + 1
        return Watch(guard=self, user_id=user_id, run_id=run_id)

    def release(self, watch: Watch) -> None:
        if watch.released:
            return
        watch.released = True
        left = self.counts[watch.user_id] - 1
        if left:
            self.counts[watch.user_id] = left
        else:
            del self.counts[watch.user_id]


# This process's guard.
get_guard = streams.loop_local(StreamGuard)
