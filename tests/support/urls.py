"""Every route a URLconf declares, read from the resolver: a sweep over them covers a new URL (or
fails) the day it is added."""

from collections.abc import Iterator

from django.urls import URLPattern, URLResolver, get_resolver


def routes(patterns: list[URLPattern | URLResolver] | None = None, prefix: str = "") -> Iterator[str]:
    """The route strings under `patterns` (the project's whole URLconf by default), `prefix`ed."""
    for p in patterns if patterns is not None else get_resolver().url_patterns:
        if isinstance(p, URLResolver):
            yield from routes(p.url_patterns, prefix + str(p.pattern))
        else:
            yield prefix + str(p.pattern)
