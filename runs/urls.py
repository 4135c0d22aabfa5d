from django.urls import include, path

from runs import health, sse

urlpatterns = [
    path("healthz/", health.healthz, name="healthz"),
    path("readyz/", health.readyz, name="readyz"),
    # A plain async view, not DRF: it streams for as long as the run lives (runs/sse.py).
    path("api/runs/<str:run_id>/stream/", sse.run_stream, name="run-stream"),
    path("api/", include("runs.api.urls")),
]
