from django.urls import URLPattern, URLResolver, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from runs.api import apis
from runs.api.errors import api_not_found

# Mounted at /api/ by runs/urls.py, after the SSE stream route (a plain async view).
urlpatterns: list[URLPattern | URLResolver] = [
    path("agents/", apis.AgentListApi.as_view(), name="agent-list"),
    path("runs/", apis.RunCollectionApi.as_view(), name="run-collection"),
    path("runs/<str:run_id>/", apis.RunDetailApi.as_view(), name="run-detail"),
    path("runs/<str:run_id>/events/", apis.RunEventsApi.as_view(), name="run-events"),
    path("runs/<str:run_id>/cancel/", apis.RunCancelApi.as_view(), name="run-cancel"),
    path("runs/<str:run_id>/stop/", apis.RunStopApi.as_view(), name="run-stop"),
    path("runs/<str:run_id>/pause/", apis.RunPauseApi.as_view(), name="run-pause"),
    path("runs/<str:run_id>/resume/", apis.RunResumeApi.as_view(), name="run-resume"),
    # Public, like the health probes.
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    # Last: any other /api/ URL is a 404 in the API's error shape, not Django's HTML page.
    re_path(r"^(?P<path>.*)$", api_not_found),
]
