"""The web process's start, for a project's `asgi.py` (docs/design/deployment.md#web-processes):

    from django.core.asgi import get_asgi_application
    from runs.asgi import wrap

    application = wrap(get_asgi_application())

The HTTP wrapper itself is runs/http/asgi.py; this adds what a web process of the app starts with.
"""

from typing import Any

from runs.conf import conf
from runs.http.asgi import wrapper


def wrap(inner: Any, *, serve_static: bool = False) -> Any:
    """`inner` (the project's `get_asgi_application()`, which set Django up) in the app's wrapper;
    `serve_static`: also serve STATIC_URL (django.contrib.staticfiles), for a deployment with no web
    server in front."""
    # Imported once Django is set up: they reach the models.
    from runs.agents.loading import require_agents
    from runs.metrics import series
    from runs.metrics.http import CountResponses
    from runs.streaming.edge import publisher

    # A web process without the agents it is configured for would refuse their runs, and one with
    # settings that cannot work would apply them wrongly: refuse to start (uvicorn runs no system
    # checks). Its metrics are set up now too: a refused metrics directory stops it here.
    conf.require()
    require_agents()
    publisher.require_edge()
    series.made()
    # The edge's publisher lives as long as the process: it must publish whether or not this
    # process serves streams. Requests are counted outermost: the body limit's 413s and the static
    # files too.
    return CountResponses(wrapper(inner, serve_static=serve_static, on_startup=_start, on_shutdown=_stop))


def _start() -> None:
    from runs.http import token_cache
    from runs.streaming.edge import publisher

    publisher.start()
    # Listening from the start: API requests use the token cache only while it listens.
    token_cache.start()


async def _stop() -> None:
    from runs.http import token_cache
    from runs.streaming.edge import publisher

    await publisher.stop()
    await token_cache.stop()
