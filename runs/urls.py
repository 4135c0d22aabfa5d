from django.urls import include, path
from django.views.generic import RedirectView

from runs import health, pages, sse
from runs.edge import hold
from runs.metrics import views as metrics

urlpatterns = [
    path("healthz/", health.healthz, name="healthz"),
    path("readyz/", health.readyz, name="readyz"),
    path("metrics/", metrics.metrics, name="metrics"),
    # A plain async view, not DRF: it streams for as long as the run lives (runs/sse.py).
    path("api/runs/<str:run_id>/stream/", sse.run_stream, name="run-stream"),
    # Only Pushpin's fetches for the streams the edge holds (runs/edge/hold.py).
    path("api/runs/<str:run_id>/stream/link/", hold.recover, name="run-stream-link"),
    path("api/", include("runs.api.urls")),
    path("", RedirectView.as_view(pattern_name="run-list"), name="home"),
    path("runs/", pages.run_list_page, name="run-list"),
    path("runs/<str:run_id>/", pages.run_watch_page, name="run-watch"),
]
