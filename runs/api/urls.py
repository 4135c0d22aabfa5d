"""The API's URLs, one operation class per URL (docs/design/api.md)."""

from django.urls import URLPattern, URLResolver, include, path, re_path

from runs.api import apis, bulk, rerun, schedules, tokens, webhooks
from runs.api.errors import api_not_found
from runs.api.schema import SchemaApi

# Mounted at /api/ by runs/urls.py, after the SSE stream route (a plain async view).
urlpatterns: list[URLPattern | URLResolver] = [
    path("agents/", apis.AgentListApi.as_view(), name="agent-list"),
    path("runs/", apis.RunCollectionApi.as_view(), name="run-collection"),
    # Before runs/<run_id>/: "cancel" and "stop" are not run ids.
    path("runs/cancel/", bulk.RunCancelMatchingApi.as_view(), name="run-cancel-matching"),
    path("runs/stop/", bulk.RunStopMatchingApi.as_view(), name="run-stop-matching"),
    path("runs/<str:run_id>/", apis.RunDetailApi.as_view(), name="run-detail"),
    path("runs/<str:run_id>/events/", apis.RunEventsApi.as_view(), name="run-events"),
    path("runs/<str:run_id>/cancel/", apis.RunCancelApi.as_view(), name="run-cancel"),
    path("runs/<str:run_id>/stop/", apis.RunStopApi.as_view(), name="run-stop"),
    path("runs/<str:run_id>/pause/", apis.RunPauseApi.as_view(), name="run-pause"),
    path("runs/<str:run_id>/resume/", apis.RunResumeApi.as_view(), name="run-resume"),
    path("runs/<str:run_id>/rerun/", rerun.RunRerunApi.as_view(), name="run-rerun"),
    path("schedules/", include(schedules.urlpatterns)),
    path("webhooks/", include(webhooks.urlpatterns)),
    path("tokens/", include(tokens.urlpatterns)),
    # A page to read it (Swagger UI) needs drf-spectacular's apps
    # in INSTALLED_APPS: the standalone site serves one at api/docs/ (config/urls.py).
    path("schema/", SchemaApi.as_view(), name="api-schema"),
    # Last: any other /api/ URL is a 404 in the API's error shape, not Django's HTML page.
    re_path(r"^(?P<path>.*)$", api_not_found),
]
