"""This process's token cache listening (runs.http.token_cache), as a web process's lifespan starts
it: for in-process tests of what a warm cache sends."""

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from runs.http.token_cache import cache, listen
from tests.support.waiting import wait_until


@contextmanager
def token_cache_listening(timeout: float = 15) -> Iterator[None]:
    """The cache's listener on an event loop of its own thread, until the block ends; the cache is
    live (listening) when the block starts, and emptied and out of use after it."""
    loop = asyncio.new_event_loop()
    started: list[asyncio.Task[None] | None] = []

    def serve() -> None:
        asyncio.set_event_loop(loop)
        started.append(listen(loop))
        loop.run_forever()
        loop.close()

    thread = threading.Thread(target=serve, name="token-cache-listener", daemon=True)
    thread.start()
    try:
        wait_until(lambda: started, timeout, "the listener's start")
        assert started[0] is not None, "no token cache here (SQLite, or RUNLEDGER_TOKEN_CACHE_SECONDS 0)"
        wait_until(lambda: cache.live, timeout, "the token cache's listener connecting")
        yield
    finally:
        task = started[0] if started else None

        def end() -> None:
            if task is None or task.done():
                loop.stop()
            else:
                task.add_done_callback(lambda _: loop.stop())
                task.cancel()

        loop.call_soon_threadsafe(end)
        thread.join(timeout)
        assert not thread.is_alive()
        assert not cache.live and not len(cache)
