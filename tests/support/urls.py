"""Every route a URLconf declares, read from the resolver: a sweep over them covers a new URL (or
fails) the day it is added. And a host project's URLconf with the app under a prefix of its own."""

import functools
from collections.abc import Iterator
from types import ModuleType

from django.contrib import admin
from django.urls import URLPattern, URLResolver, get_resolver, include, path
from drf_spectacular.views import SpectacularAPIView


def routes(patterns: list[URLPattern | URLResolver] | None = None, prefix: str = "") -> Iterator[str]:
    """The route strings under `patterns` (the project's whole URLconf by default), `prefix`ed."""
    for p in patterns if patterns is not None else get_resolver().url_patterns:
        if isinstance(p, URLResolver):
            yield from routes(p.url_patterns, prefix + str(p.pattern))
        else:
            yield prefix + str(p.pattern)


def host_patterns(prefix: str) -> list[URLPattern | URLResolver]:
    """A host's URLs: its admin and an API schema of its own (a DRF view, on the host's
    SPECTACULAR_SETTINGS) at its root, the app under `prefix` as docs/how-to/embed.md mounts it."""
    return [
        path("admin/", admin.site.urls),
        path("api/schema/", SpectacularAPIView.as_view(), name="hosts-schema"),
        path(prefix, include("runs.urls")),
    ]


@functools.cache
def host_urlconf(prefix: str) -> ModuleType:
    """`host_patterns(prefix)` as a URLconf module, for `override_settings(ROOT_URLCONF=…)`; one
    object per prefix, so Django's resolver cache keeps it."""
    module = ModuleType(f"host_urls_{prefix.strip('/').replace('/', '_')}")
    module.urlpatterns = host_patterns(prefix)
    return module
