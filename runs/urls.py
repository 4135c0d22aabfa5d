"""The app's URLs, under the `runs` namespace, in three groups a host may include apart
(docs/how-to/embed.md): `api` (the REST API and the SSE streams), `pages` (the end-user pages) and
`operations` (the probes and /metrics/). `path("<prefix>/", include("runs.urls"))` takes all three;
`include(parts("api", "operations"))` only those named, still under the one namespace (two
includes of one namespace would let `reverse` see only one). The staff console comes with the
admin site's URLs (runs.admin).
"""

from django.urls import URLPattern, URLResolver, include, path
from django.views.generic import RedirectView

from runs import health
from runs.metrics import views as metrics
from runs.pages import run_list_page, run_watch_page
from runs.streaming import views as streaming
from runs.streaming import wait
from runs.streaming.edge import hold

app_name = "runs"

Patterns = list[URLPattern | URLResolver]

operations: Patterns = [
    path("healthz/", health.healthz, name="healthz"),
    path("readyz/", health.readyz, name="readyz"),
    path("metrics/", metrics.metrics, name="metrics"),
]
api: Patterns = [
    # A plain async view, not DRF: it streams for as long as the run lives (runs/streaming/views.py).
    path("api/runs/<str:run_id>/stream/", streaming.run_stream, name="run-stream"),
    # Only Pushpin's fetches for the streams the edge holds (runs/streaming/edge/hold.py).
    path("api/runs/<str:run_id>/stream/link/", hold.recover, name="run-stream-link"),
    # Async too: it waits on the streams' wake-ups (runs/streaming/wait.py).
    path("api/runs/<str:run_id>/wait/", wait.run_wait, name="run-wait"),
    path("api/", include("runs.api.urls")),
]
pages: Patterns = [
    path("", RedirectView.as_view(pattern_name="runs:run-list"), name="home"),
    path("runs/", run_list_page, name="run-list"),
    path("runs/<str:run_id>/", run_watch_page, name="run-watch"),
]
GROUPS = {"operations": operations, "api": api, "pages": pages}

urlpatterns: Patterns = [*operations, *api, *pages]


def parts(*names: str) -> tuple[Patterns, str]:
    """The named groups, for `include()`, under the app's namespace."""
    unknown = sorted(set(names) - set(GROUPS))
    if unknown or not names:
        raise ValueError(f"runs.urls.parts takes some of {', '.join(GROUPS)}, not {', '.join(unknown) or 'none'}")
    return [pattern for name in GROUPS if name in names for pattern in GROUPS[name]], app_name
