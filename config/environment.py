"""The standalone site's own environment (docs/reference/settings.md#the-standalone-sites-environment):
Django's variables (`DATABASE_URL`, `DJANGO_*`) and the site's `RUNLEDGER_*` ones, each declared
once, read and refused with the same kinds as the app's settings (runs/conf.py), whose reference is
generated from them too.
"""

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from runs.setting_kinds import EDGE, SERVING, WEB, WORKER, Flag, Names, Registry, Seconds, Text, Whole, pattern

BASE_DIR = Path(__file__).resolve().parent.parent
# Hosts a machine reaches only from itself: the embedded default, tests and a proxy on the same box.
LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]", "testserver")


def is_origin(text: str) -> bool:
    try:
        parts = urlsplit(text)
    except ValueError:  # an unclosed [ of an IPv6 address
        return False
    return parts.scheme in ("http", "https") and bool(parts.netloc) and text == f"{parts.scheme}://{parts.netloc}"


class Origins(Names):
    """Origins (`https://app.example.com`, a port if it is not the scheme's): a path, a trailing
    slash or `*` would match no browser's Origin header, and the site would refuse its pages
    without saying why."""

    def __init__(self, doc: str, processes: tuple[str, ...]) -> None:
        super().__init__([], doc, processes, must="a list of origins such as https://app.example.com", item=is_origin)

    def refusal(self, given: Any) -> str:
        items = self.parse(given) if isinstance(given, str) else list(given)
        bad = next((item for item in items if not (isinstance(item, str) and is_origin(item))), given)
        return (
            f"{self.name} must list origins such as https://app.example.com (a scheme and a host, a port if need "
            f"be, nothing after it), not {bad!r}"
        )


class Django(Registry):
    """Django's own variables, by the names deployments give them."""

    prefix = ""

    DATABASE_URL = Text(
        "",
        "the database: postgres://user:password@host:5432/name (psycopg, the `postgres` extra) or sqlite:///path",
        SERVING,
        pattern=r"(postgres|postgresql|sqlite)://.*",
        must="a postgres:// or sqlite:// URL",
        shown="a SQLite file, `runledger.sqlite3` beside manage.py",
        secret=True,
    )
    DJANGO_SECRET_KEY = Text(
        "",
        "Django's signing key (sessions, CSRF; the edge's RUNLEDGER_GRIP_KEY is derived from it); required as "
        "soon as DJANGO_ALLOWED_HOSTS names a host beyond this machine",
        (WEB, WORKER, EDGE),
        shown="a random local key (RUNLEDGER_LOCAL_SECRET_FILE) while every allowed host is local",
        secret=True,
    )
    DJANGO_ALLOWED_HOSTS = Names(
        list(LOCAL_HOSTS),
        "the host names the site answers to",
        (WEB,),
        must="a list of host names",
        item=pattern(r"\S+"),
    )
    DJANGO_CSRF_TRUSTED_ORIGINS = Names(
        [], "the origins browsers send writes from", (WEB,), must="a list of origins", item=pattern(r"\S+")
    )
    DJANGO_DEBUG = Flag(False, "Django's debug mode: tracebacks in answers; for development only", SERVING)
    DJANGO_SECURE_HTTPS = Flag(
        False,
        "behind TLS: secure cookies, HSTS, plain HTTP redirected (the probes exempt), the proxy's "
        "X-Forwarded-Proto trusted, so the proxy must set it",
        (WEB,),
    )
    DJANGO_SECURE_HSTS_SECONDS = Whole(
        365 * 24 * 3600, "how long browsers keep to HTTPS, with DJANGO_SECURE_HTTPS", (WEB,), minimum=0, unit="seconds"
    )
    DJANGO_SECURE_HSTS_PRELOAD = Flag(True, "ask for HSTS preloading, with DJANGO_SECURE_HTTPS", (WEB,))
    DJANGO_CORS_ALLOWED_ORIGINS = Origins(
        "the origins whose pages may call the API (browser apps on other origins); none may while empty", (WEB,)
    )
    DJANGO_CORS_ALLOW_CREDENTIALS = Flag(
        False, "those origins may use the session cookie too, and are trusted for CSRF", (WEB,)
    )


class Site(Django):
    """The site's environment: Django's variables and its own."""

    prefix = "RUNLEDGER_"

    DB_CONNECT_TIMEOUT = Whole(
        3, "how long a connect to PostgreSQL may take before the request answers 503", SERVING, unit="seconds"
    )
    DB_POOL_SIZE = Whole(
        10, "PostgreSQL connections a web process pools (threads wait for one)", (WEB,), minimum=0, zero="no pool"
    )
    SQLITE_TIMEOUT = Seconds(20, "how long a write waits for SQLite's lock", SERVING, zero="no wait")
    STATIC_ROOT = Text(
        str(BASE_DIR / "staticfiles"),
        "where collectstatic puts the files the proxy serves",
        (WEB,),
        shown="`staticfiles/` beside manage.py",
    )
    SERVE_STATIC = Flag(True, "whether a web process serves /static/ itself (0 when the proxy does)", (WEB,))
    LOCAL_SECRET_FILE = Text(
        str(BASE_DIR / ".runledger-secret-key"),
        "the random local secret key, made on first use, while DJANGO_SECRET_KEY is unset",
        SERVING,
        shown="`.runledger-secret-key` beside manage.py",
    )
    LOG_LEVEL = Text(
        "",
        "the log level (DEBUG, INFO, WARNING, ERROR or CRITICAL) of every logger",
        SERVING,
        pattern="DEBUG|INFO|WARNING|ERROR|CRITICAL",
        must="DEBUG, INFO, WARNING, ERROR or CRITICAL",
        shown="WARNING, and INFO for the app's own lines",
    )
    TEST_DB_NAME = Text("test_runledger", "the PostgreSQL database the test suite makes and drops", ("tests",))


site = Site(os.environ)
