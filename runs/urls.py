from django.urls import path

from runs import health

urlpatterns = [
    path("healthz/", health.healthz, name="healthz"),
    path("readyz/", health.readyz, name="readyz"),
]
