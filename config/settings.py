"""The standalone site's settings (docs/design/deployment.md#settings).

Its environment is read through two registries: the app's settings (`RUNLEDGER_*`, runs/conf.py),
as any project can with `runs.conf.settings_from_environment()`, and the site's own (`DATABASE_URL`,
`DJANGO_*` and a few `RUNLEDGER_*`, config/environment.py).
"""

import contextlib
import errno
import os
import secrets
import stat
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

from config.environment import BASE_DIR, LOCAL_HOSTS, Site, site
from runs.api.schema_settings import SCHEMA_SETTINGS
from runs.conf import AppSettings, settings_from_environment

# The app's settings (runs/conf.py) as the environment gives them, parsed by their declarations.
app = AppSettings(os.environ)
# A value that is not what its declaration says is refused here, naming the variable, so every
# process (not only the one that would trip over it later) stops with the same message.
_refused = site.value_problems() + app.value_problems()
if _refused:
    raise ImproperlyConfigured("; ".join(_refused))


# Connections a web process may hold at once on PostgreSQL (RUNLEDGER_DB_POOL_SIZE): its stream
# threads (4 + 4) and a few requests in flight; more requests wait for one. Workers keep their own.
DEFAULT_DB_POOL_SIZE: int = Site.DB_POOL_SIZE.default


def database_from_url(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        # sqlite:///relative.db or sqlite:////absolute/path.db
        name = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
        return sqlite_database(Path(name) if name else BASE_DIR / "runledger.sqlite3")
    if parts.scheme not in ("postgres", "postgresql"):
        raise ValueError(f"DATABASE_URL scheme {parts.scheme!r} is not supported")
    query = dict(parse_qsl(parts.query))
    options: dict[str, Any] = {
        # Fail fast when the server is unreachable, so a request answers 503 instead of hanging.
        "connect_timeout": int(query.pop("connect_timeout", site.DB_CONNECT_TIMEOUT)),
        # A server that vanished without a FIN or RST (a network cut, a dead machine) is noticed
        # within about 20 s instead of the kernel's hours, so a worker's connection waiting on it
        # fails and reconnects (libpq keywords; the URL's query overrides them).
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": 20_000,
        **query,
    }
    pool_size = site.DB_POOL_SIZE
    if pool_size > 0:
        # A web process borrows its connections from a pool of its own (psycopg_pool through
        # Django): a new PostgreSQL connection costs ~9 ms here, a borrowed one ~0.1 ms. Its threads
        # give theirs back at the end of each request or read. Waiting for a free one is bounded
        # like a connect, so an unreachable or exhausted database still answers 503 promptly.
        # 0 turns the pool off (a connection per request). `runworker` takes itself off the pool
        # (runs/worker/db.py): its database threads keep their connections for life.
        options["pool"] = {
            "min_size": min(2, pool_size),
            "max_size": pool_size,
            "timeout": float(options["connect_timeout"]),
            # Retry a lost server at most this long per attempt: psycopg_pool's default backs off
            # for up to 5 minutes, which kept web processes answering 503 long after an outage.
            "reconnect_timeout": float(options["connect_timeout"]),
        }
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "runledger",
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "OPTIONS": options,
        "CONN_MAX_AGE": 0,
        # Without a pool, a connection per request needs no check. With one, Django makes the pool
        # check each connection it lends (an empty statement, a round trip on every request): the
        # pool discards a connection found broken in use instead, so after a PostgreSQL restart
        # each idle one fails the one request that draws it, with a 503 that clients retry
        # (docs/design/deployment.md#connections).
        "CONN_HEALTH_CHECKS": False,
        "TEST": {"NAME": site.TEST_DB_NAME},
    }


def sqlite_database(path: Path) -> dict[str, Any]:
    # Made here, empty and readable by this user only, before SQLite would make it with the umask's
    # mode (world-readable by default): it holds sessions and API tokens, and SQLite gives its
    # journal, -wal and -shm files the database file's mode. O_EXCL: never an existing file, nor
    # through a link. One that cannot be made here is left to SQLite, which says why.
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(path),
        # IMMEDIATE takes the write lock at BEGIN, so read-check-write transactions serialise
        # instead of failing with "database is locked" when they upgrade; the timeout is the wait.
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "timeout": site.SQLITE_TIMEOUT,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
        # A file, never :memory: — the in-memory test database ignores the busy timeout.
        "TEST": {"NAME": str(path.with_name(path.stem + "-test" + path.suffix))},
    }


def _secret_key(allowed_hosts: list[str]) -> str:
    """DJANGO_SECRET_KEY; required as soon as any host beyond this machine is allowed, so a public
    deployment never signs sessions with a key anyone could read. Refused here, at settings load,
    so every command and every server refuses alike. The embedded default keeps a random key of
    its own in a file beside the project (RUNLEDGER_LOCAL_SECRET_FILE), made on first use."""
    key = site.DJANGO_SECRET_KEY
    if key:
        return key
    public = [host for host in allowed_hosts if host not in LOCAL_HOSTS]
    if public:
        raise ImproperlyConfigured(
            f"DJANGO_SECRET_KEY must be set: DJANGO_ALLOWED_HOSTS allows {', '.join(public)}, beyond this machine "
            "(a random local key is kept only while every allowed host is local)"
        )
    path = Path(site.LOCAL_SECRET_FILE)
    if not path.exists():
        # Written whole to a file of its own (mode 0600), then linked into place, which fails if
        # the file exists: of processes starting at once, one key wins, and no process can read a
        # file another has created but not yet written.
        made, made_path = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(made, "w") as written:
                written.write(secrets.token_urlsafe(50))
            os.link(made_path, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(made_path)
    key = _read_private(path).strip()
    if not key:
        raise ImproperlyConfigured(f"{path} (the local secret key) is empty: delete it, or set DJANGO_SECRET_KEY")
    return key


def _read_private(path: Path) -> str:
    """The local secret key file's text, read only once it is known to be this user's alone: a key
    another user could read signs sessions anyone could forge, and one another user wrote (a file
    made first in a shared folder) would be theirs. Never through a link."""
    advice = "chmod 600 it if it is yours, or delete it (a new key signs everyone out), or set DJANGO_SECRET_KEY"
    try:
        # O_NONBLOCK: a FIFO put there would otherwise hold the process at its open.
        opened = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        problem = "it is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        raise ImproperlyConfigured(f"{path} (the local secret key) cannot be used: {problem}") from exc
    with os.fdopen(opened) as file:
        found = os.fstat(file.fileno())
        if not stat.S_ISREG(found.st_mode) or found.st_uid != os.geteuid() or found.st_mode & 0o077:
            raise ImproperlyConfigured(
                f"{path} (the local secret key) must be a file of this user's (uid {os.geteuid()}) that no other "
                f"user may read or write, not mode {stat.S_IMODE(found.st_mode):04o} of uid {found.st_uid}: {advice}"
            )
        return file.read()


DEBUG = site.DJANGO_DEBUG
ALLOWED_HOSTS = site.DJANGO_ALLOWED_HOSTS
SECRET_KEY = _secret_key(ALLOWED_HOSTS)
CSRF_TRUSTED_ORIGINS = site.DJANGO_CSRF_TRUSTED_ORIGINS

# Behind a TLS-terminating proxy (deploy/nginx.conf.template): cookies only over HTTPS, HSTS, plain
# HTTP redirected, and the proxy's X-Forwarded-Proto trusted to say which it was — the proxy must
# set it (the template does), or a client could claim HTTPS. The health checks answer over plain
# HTTP too, for load balancers. HSTS covers subdomains and asks for preloading by default, as
# `check --deploy` expects; DJANGO_SECURE_HSTS_PRELOAD=0 opts out.
SECURE_HTTPS = site.DJANGO_SECURE_HTTPS
if SECURE_HTTPS:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = [r"^healthz/$", r"^readyz/$"]
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = site.DJANGO_SECURE_HSTS_SECONDS
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = site.DJANGO_SECURE_HSTS_PRELOAD

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "runs",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# Browser apps on other origins (docs/how-to/cross-origin.md), opted into: the settings that page
# gives a host, with django-cors-headers (the cors extra), for the app's API only. Cookies too only
# with DJANGO_CORS_ALLOW_CREDENTIALS=1, which also trusts those origins' writes for CSRF (each write
# still carries the CSRF token).
_cors_origins = site.DJANGO_CORS_ALLOWED_ORIGINS
_cors_credentials = site.DJANGO_CORS_ALLOW_CREDENTIALS
if _cors_credentials and not _cors_origins:
    raise ImproperlyConfigured("DJANGO_CORS_ALLOW_CREDENTIALS=1 needs the origins, in DJANGO_CORS_ALLOWED_ORIGINS")
if _cors_origins:
    try:
        from corsheaders.defaults import default_headers
    except ModuleNotFoundError as exc:
        raise ImproperlyConfigured(
            "DJANGO_CORS_ALLOWED_ORIGINS needs django-cors-headers (pip install 'django-runledger[cors]')"
        ) from exc
    INSTALLED_APPS.append("corsheaders")
    MIDDLEWARE.insert(0, "corsheaders.middleware.CorsMiddleware")
    CORS_ALLOWED_ORIGINS = _cors_origins
    CORS_URLS_REGEX = r"^/api/"
    CORS_ALLOW_HEADERS = (*default_headers, "idempotency-key", "last-event-id")
    CORS_EXPOSE_HEADERS = ("retry-after", "idempotent-replayed")
    if _cors_credentials:
        CORS_ALLOW_CREDENTIALS = True
        CSRF_TRUSTED_ORIGINS += _cors_origins

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # Its pages, its login page too, come from runs/templates/ through APP_DIRS, as in any
        # host project; templates/ holds only what this site overrides for itself (its admin's
        # branding).
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": database_from_url(site.DATABASE_URL)
    if site.DATABASE_URL
    else sqlite_database(BASE_DIR / "runledger.sqlite3")
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": f"django.contrib.auth.password_validation.{name}"}
    for name in (
        "UserAttributeSimilarityValidator",
        "MinimumLengthValidator",
        "CommonPasswordValidator",
        "NumericPasswordValidator",
    )
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# Where `manage.py collectstatic` puts the admin's and the pages' files for the proxy to serve.
STATIC_ROOT = Path(site.STATIC_ROOT)
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/runs/"

# Django's bound on a request body, the app's own (RUNLEDGER_MAX_BODY_BYTES, which the ASGI guard
# applies before Django reads a body): Django's default is ten times larger. deploy/nginx.conf.template's
# client_max_body_size repeats the app's default (change both together).
DATA_UPLOAD_MAX_MEMORY_SIZE = app.MAX_BODY_BYTES

# The app's API sets its own DRF behaviour (runs/api/base.py) and schema (runs/api/schema.py);
# these are the tests' client default, the docs page's (config/urls.py) assets, served here, and
# the schema drf-spectacular's own deploy check generates: this site's API is the app's.
REST_FRAMEWORK = {"TEST_REQUEST_DEFAULT_FORMAT": "json"}
SPECTACULAR_SETTINGS = {
    **SCHEMA_SETTINGS,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SERVE_AUTHENTICATION": [],
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
}

# RUNLEDGER_LOG_FORMAT=json: one JSON object per line, with the run, attempt and worker a line
# concerns (runs/logs.py); uvicorn's own lines too. `text`: the human-readable default.
_json_logs = app.LOG_FORMAT == "json"
LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "runs.logs.ContextFilter"}},
    "formatters": {"json": {"()": "runs.logs.JsonFormatter"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "filters": ["context"],
            **({"formatter": "json"} if _json_logs else {}),
        }
    },
    "root": {"handlers": ["console"], "level": site.LOG_LEVEL or "WARNING"},
    "loggers": {
        "runs": {"level": site.LOG_LEVEL or "INFO"},
        # uvicorn configured these before Django started; in JSON they go through ours instead.
        **{
            name: {"handlers": ["console"], "level": "INFO", "propagate": False}
            for name in (("uvicorn", "uvicorn.error", "uvicorn.access") if _json_logs else ())
        },
    },
}

# This site's choice where the app's default leaves the project alone: every admin of the site
# (users, groups, tokens) guarded against hostile URLs, not only the console's (runs.admin).
RUNLEDGER_HARDEN_ADMIN = True

# Every RUNLEDGER_* setting the environment sets (runs/conf.py says what each must be and does),
# as a host project takes them: a bad value stops every process here, naming it; one not set keeps
# the app's default.
globals().update(settings_from_environment())
