"""Runledger settings.

`DATABASE_URL` selects the database (postgres://… or sqlite:///path); without it the embedded
default is a SQLite file next to the project. Every interval is a `RUNLEDGER_*` setting, each also
readable from the environment variable of the same name, so tests can make them short.
"""

import contextlib
import errno
import hashlib
import hmac
import os
import re
import secrets
import stat
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def _env_number(name: str, default: float, kind: type[float] | type[int]) -> Any:
    # Refused here, naming the variable, so every process (not only the one that would trip over
    # it later) stops with the same message.
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = None
    if value is None or value < 0 or value != value or value == float("inf"):
        unit = "a whole number" if kind is int else "a number"
        raise ImproperlyConfigured(f"{name} must be {unit} ≥ 0, not {raw!r}")
    return value


def _env_float(name: str, default: float) -> float:
    return float(_env_number(name, default, float))


def _env_int(name: str, default: int) -> int:
    return int(_env_number(name, default, int))


def _env_list(name: str, default: list[str]) -> list[str]:
    if name not in os.environ:
        return default
    return [item.strip() for item in os.environ[name].split(",") if item.strip()]


# Connections a web process may hold at once on PostgreSQL (RUNLEDGER_DB_POOL_SIZE): its stream
# threads (4 + 4) and a few requests in flight; more requests wait for one. Workers keep their own.
DEFAULT_DB_POOL_SIZE = 10


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
        "connect_timeout": int(query.pop("connect_timeout", _env_int("RUNLEDGER_DB_CONNECT_TIMEOUT", 3))),
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
    pool_size = _env_int("RUNLEDGER_DB_POOL_SIZE", DEFAULT_DB_POOL_SIZE)
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
        "CONN_HEALTH_CHECKS": True,
        "TEST": {"NAME": os.environ.get("RUNLEDGER_TEST_DB_NAME", "test_runledger")},
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
            "timeout": _env_float("RUNLEDGER_SQLITE_TIMEOUT", 20),
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
        # A file, never :memory: — the in-memory test database ignores the busy timeout.
        "TEST": {"NAME": str(path.with_name(path.stem + "-test" + path.suffix))},
    }


# Hosts a machine reaches only from itself: the embedded default, tests and a proxy on the same box.
LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]", "testserver")


def _secret_key(allowed_hosts: list[str]) -> str:
    """DJANGO_SECRET_KEY; required as soon as any host beyond this machine is allowed, so a public
    deployment never signs sessions with a key anyone could read. Refused here, at settings load,
    so every command and every server refuses alike. The embedded default keeps a random key of
    its own in a file beside the project (RUNLEDGER_LOCAL_SECRET_FILE), made on first use."""
    key = os.environ.get("DJANGO_SECRET_KEY", "")
    if key:
        return key
    public = [host for host in allowed_hosts if host not in LOCAL_HOSTS]
    if public:
        raise ImproperlyConfigured(
            f"DJANGO_SECRET_KEY must be set: DJANGO_ALLOWED_HOSTS allows {', '.join(public)}, beyond this machine "
            "(a random local key is kept only while every allowed host is local)"
        )
    path = Path(os.environ.get("RUNLEDGER_LOCAL_SECRET_FILE") or BASE_DIR / ".runledger-secret-key")
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


DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
ALLOWED_HOSTS = _env_list("DJANGO_ALLOWED_HOSTS", list(LOCAL_HOSTS))
SECRET_KEY = _secret_key(ALLOWED_HOSTS)
CSRF_TRUSTED_ORIGINS = _env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

# Behind a TLS-terminating proxy (deploy/nginx.conf.template): cookies only over HTTPS, HSTS, plain
# HTTP redirected, and the proxy's X-Forwarded-Proto trusted to say which it was — the proxy must
# set it (the template does), or a client could claim HTTPS. The health checks answer over plain
# HTTP too, for load balancers. HSTS covers subdomains and asks for preloading by default, as
# `check --deploy` expects; DJANGO_SECURE_HSTS_PRELOAD=0 opts out.
SECURE_HTTPS = os.environ.get("DJANGO_SECURE_HTTPS", "") == "1"
if SECURE_HTTPS:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = [r"^healthz/$", r"^readyz/$"]
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = _env_int("DJANGO_SECURE_HSTS_SECONDS", 365 * 24 * 3600)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = os.environ.get("DJANGO_SECURE_HSTS_PRELOAD", "1") == "1"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
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

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
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
    "default": database_from_url(os.environ["DATABASE_URL"])
    if os.environ.get("DATABASE_URL")
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
STATIC_ROOT = Path(os.environ.get("RUNLEDGER_STATIC_ROOT") or BASE_DIR / "staticfiles")
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/runs/"

# The largest request body, in bytes: the ASGI guard (config/asgi.py) refuses a larger one with 413
# before Django reads it, and deploy/nginx.conf.template's client_max_body_size repeats this
# default (change both together).
DATA_UPLOAD_MAX_MEMORY_SIZE = _env_int("RUNLEDGER_MAX_BODY_BYTES", 256 * 1024)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "runs.api.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # JSON in and out; the parser refuses what could not be stored or served back (runs/api/parsers.py).
    "DEFAULT_PARSER_CLASSES": ["runs.api.parsers.JSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # Every error in the shape of DESIGN §6.
    "EXCEPTION_HANDLER": "runs.api.errors.exception_handler",
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Runledger API",
    "DESCRIPTION": "Durable agent runs: events, streams, cancel, stop, pause and resume.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # The schema and its docs page are public: credentials sent to them are ignored, not checked.
    "SERVE_AUTHENTICATION": [],
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "ENUM_NAME_OVERRIDES": {"RunStatusEnum": "runs.api.serializers.RUN_STATUSES"},
    # The docs page's scripts are served by this app (no CDN: it must work offline).
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # The SSE stream is a plain async view that spectacular cannot see; the hook documents it.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "runs.sse_schema.document_run_stream",
    ],
}

# RUNLEDGER_LOG_FORMAT=json: one JSON object per line, with the run, attempt and worker a line
# concerns (runs/logs.py); uvicorn's own lines too. Anything else: the human-readable default.
RUNLEDGER_LOG_FORMAT = os.environ.get("RUNLEDGER_LOG_FORMAT", "text")
_json_logs = RUNLEDGER_LOG_FORMAT == "json"
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
    "root": {"handlers": ["console"], "level": os.environ.get("RUNLEDGER_LOG_LEVEL", "WARNING")},
    "loggers": {
        "runs": {"level": os.environ.get("RUNLEDGER_LOG_LEVEL", "INFO")},
        # uvicorn configured these before Django started; in JSON they go through ours instead.
        **{
            name: {"handlers": ["console"], "level": "INFO", "propagate": False}
            for name in (("uvicorn", "uvicorn.error", "uvicorn.access") if _json_logs else ())
        },
    },
}

# Threads a web process serves its synchronous views on (the API, the admin, the pages), one
# request each at a time, as a WSGI server's pool; streams need none. Database work beyond
# RUNLEDGER_DB_POOL_SIZE connections waits for one (up to the connect timeout, then 503).
RUNLEDGER_WEB_THREADS = _env_int("RUNLEDGER_WEB_THREADS", 32)
if RUNLEDGER_WEB_THREADS < 1:
    raise ImproperlyConfigured("RUNLEDGER_WEB_THREADS must be at least 1: the threads that serve the API and the pages")

# The modules that register agents (DESIGN §4), imported by every web and worker process at start;
# one that cannot be imported stops the process. The environment variable is comma-separated.
RUNLEDGER_AGENTS = _env_list("RUNLEDGER_AGENTS", ["runs.agents.demo"])

# Intervals (seconds). Each is also read from the environment variable of the same name.
RUNLEDGER_LEASE_SECONDS = _env_float("RUNLEDGER_LEASE_SECONDS", 30)
RUNLEDGER_HEARTBEAT_SECONDS = _env_float("RUNLEDGER_HEARTBEAT_SECONDS", 10)
RUNLEDGER_POLL_SECONDS = _env_float("RUNLEDGER_POLL_SECONDS", 2)
RUNLEDGER_SQLITE_POLL_SECONDS = _env_float("RUNLEDGER_SQLITE_POLL_SECONDS", 0.2)
RUNLEDGER_SWEEP_SECONDS = _env_float("RUNLEDGER_SWEEP_SECONDS", 5)
RUNLEDGER_SHUTDOWN_GRACE_SECONDS = _env_float("RUNLEDGER_SHUTDOWN_GRACE_SECONDS", 10)
RUNLEDGER_SSE_KEEPALIVE_SECONDS = _env_float("RUNLEDGER_SSE_KEEPALIVE_SECONDS", 15)
RUNLEDGER_SSE_RETRY_MS = _env_int("RUNLEDGER_SSE_RETRY_MS", 2000)
RUNLEDGER_LISTEN_RECONNECT_SECONDS = _env_float("RUNLEDGER_LISTEN_RECONNECT_SECONDS", 0.5)
RUNLEDGER_IDEMPOTENCY_TTL_SECONDS = _env_int("RUNLEDGER_IDEMPOTENCY_TTL_SECONDS", 24 * 3600)
RUNLEDGER_DEFAULT_MAX_ATTEMPTS = _env_int("RUNLEDGER_DEFAULT_MAX_ATTEMPTS", 3)

# Limits, so one user cannot take the service from everyone else (DESIGN §6). Each is also read
# from the environment variable of the same name; 0 means unlimited. `runs.limits` checks them.
# Queued + running + waiting runs one user may own; a create beyond answers 429.
RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER = _env_int("RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER", 1000)
# Runs one user may keep, finished ones included, until `purge_runs` deletes them; a create beyond
# answers 429. Ten times the active cap: a busy user's history of many days between purges.
RUNLEDGER_MAX_RUNS_PER_USER = _env_int("RUNLEDGER_MAX_RUNS_PER_USER", 10_000)
# Bytes of JSON one user's runs may store (inputs, events' data, outputs and errors); a create or a
# resume that would pass it answers 429. 1 GB: a full 10,000 runs of 100 kB each, while a few users
# cannot fill a disk. Agents' events are bounded by each run's budgets, never refused by this.
RUNLEDGER_MAX_STORED_BYTES_PER_USER = _env_int("RUNLEDGER_MAX_STORED_BYTES_PER_USER", 1_000_000_000)
# The bytes one answer carries at most, whatever the rows hold. An events page or one read of a
# stream's replay stops before the event that would pass this (always one event at least): 4 MB, so
# that an answer stays under 5 MB with its envelope, and a web process's 32 threads and 4 stream
# readers hold at most a few hundred MB between them.
RUNLEDGER_MAX_PAGE_BYTES = _env_int("RUNLEDGER_MAX_PAGE_BYTES", 4_000_000)
# A run in a list (`GET /api/runs/`) carries its input, output and error only when each is this
# many bytes of JSON or fewer (its end_reason only this many bytes' worth of characters), and says
# which it left out (`truncated`); the run's own page has them whole. 1,000: a 500-run page is then
# under 5 MB even with each value doubled by escaping, and most inputs (an agent's options) fit.
RUNLEDGER_MAX_LIST_VALUE_BYTES = _env_int("RUNLEDGER_MAX_LIST_VALUE_BYTES", 1000)
# Runs of one owner the workers run at once; claims are fair across owners whatever this is.
RUNLEDGER_MAX_RUNNING_PER_USER = _env_int("RUNLEDGER_MAX_RUNNING_PER_USER", 0)
# Streams one user holds at once on one web process (DESIGN §5); beyond answers 429.
RUNLEDGER_MAX_STREAMS_PER_USER = _env_int("RUNLEDGER_MAX_STREAMS_PER_USER", 20)
# Seconds a stream lasts before it ends cleanly; the client resumes with Last-Event-ID (DESIGN §5).
RUNLEDGER_SSE_MAX_SECONDS = _env_float("RUNLEDGER_SSE_MAX_SECONDS", 300)
# Seconds between an open stream's re-checks of its user (still active, token or session still
# there, run still visible); a stream that fails one ends.
RUNLEDGER_SSE_RECHECK_SECONDS = _env_float("RUNLEDGER_SSE_RECHECK_SECONDS", 5)
# Budgets and deadline of a run created without them (DESIGN §6).
RUNLEDGER_DEFAULT_MAX_EVENTS = _env_int("RUNLEDGER_DEFAULT_MAX_EVENTS", 100_000)
RUNLEDGER_DEFAULT_MAX_STEPS = _env_int("RUNLEDGER_DEFAULT_MAX_STEPS", 10_000)
RUNLEDGER_DEFAULT_DEADLINE_SECONDS = _env_int("RUNLEDGER_DEFAULT_DEADLINE_SECONDS", 24 * 3600)
# Failed logins (per username and per client address) and failed token authentications (per client
# address) allowed within the window; beyond, further tries answer 429 until the window has passed.
RUNLEDGER_AUTH_FAILURES_MAX = _env_int("RUNLEDGER_AUTH_FAILURES_MAX", 10)
RUNLEDGER_AUTH_FAILURE_WINDOW_SECONDS = _env_int("RUNLEDGER_AUTH_FAILURE_WINDOW_SECONDS", 300)
# The Retry-After a refused create or stream carries: when a run or a stream may have ended.
RUNLEDGER_LIMIT_RETRY_AFTER_SECONDS = _env_int("RUNLEDGER_LIMIT_RETRY_AFTER_SECONDS", 10)

# Workers (`manage.py runworker`). Each is also read from the environment variable of the same name.
# Runs one worker process executes at once (its asyncio tasks); `--concurrency` overrides it.
RUNLEDGER_WORKER_CONCURRENCY = _env_int("RUNLEDGER_WORKER_CONCURRENCY", 4)
# Slots of each worker filled only with a run of an owner who has none running, so that one user's
# long runs cannot keep everyone else's queued until they end (a worker keeps at least two slots
# open to everyone). 1: another user's run starts at once on the default install (4 slots), at the
# cost of one slot a lone user cannot fill (3 of 4). 0 keeps none.
RUNLEDGER_WORKER_NEWCOMER_SLOTS = _env_int("RUNLEDGER_WORKER_NEWCOMER_SLOTS", 1)
# LISTEN/NOTIFY wake-ups on PostgreSQL; 0 relies on polling alone (e.g. behind a transaction-pooling
# PgBouncer, where LISTEN does not work).
RUNLEDGER_WORKER_LISTEN = os.environ.get("RUNLEDGER_WORKER_LISTEN", "1") not in ("0", "false", "no", "")
# How long a cancelled attempt's agent gets to unwind before the worker abandons it.
RUNLEDGER_CANCEL_GRACE_SECONDS = _env_float("RUNLEDGER_CANCEL_GRACE_SECONDS", 0.5)
# Names of the worker's environment variables its agents' tool processes get too, beside the few
# every one gets (PATH, HOME, LANG, … : runs/worker/steps.py TOOL_ENV). None by default: a tool
# runs an agent's — a model's — choice of commands, and the worker's environment holds its
# secrets. The environment variable is comma-separated.
RUNLEDGER_TOOL_ENV = _env_list("RUNLEDGER_TOOL_ENV", [])
# Most events one append transaction carries; events emitted while an append is in flight are
# batched into the next one.
RUNLEDGER_APPEND_BATCH_MAX = _env_int("RUNLEDGER_APPEND_BATCH_MAX", 200)

# The `openai_chat` agent (runs.agents.openai_chat): any OpenAI-compatible Chat Completions endpoint —
# OpenAI, vLLM, Ollama. Each is also read from the environment variable of the same name. An empty
# key suits servers that need none (no Authorization header is sent).
RUNLEDGER_OPENAI_BASE_URL = os.environ.get("RUNLEDGER_OPENAI_BASE_URL", "https://api.openai.com/v1")
RUNLEDGER_OPENAI_API_KEY = os.environ.get("RUNLEDGER_OPENAI_API_KEY", "")
# The largest `max_tokens` an `openai_chat` run may ask for (0 = no bound), so that what one run may
# ask of the model server is bounded like any other input: a create beyond it is a 400. A run that
# names none gets the model server's own default.
RUNLEDGER_OPENAI_MAX_TOKENS = _env_int("RUNLEDGER_OPENAI_MAX_TOKENS", 4096)
# Whether runs that do not say (input `continue`) continue a requeued answer in place; only for
# servers that support vLLM's `continue_final_message` (OpenAI refuses the parameter).
RUNLEDGER_OPENAI_CONTINUE = os.environ.get("RUNLEDGER_OPENAI_CONTINUE", "0") not in ("0", "false", "no", "")

# The SSE edge (DESIGN §10, runs/edge/): Pushpin holds the streams, `bin/edge` starts it.
# RUNLEDGER_GRIP_URL: the control socket of each Pushpin in front of the web processes, where they
# publish, comma-separated (`ipc:///run/runledger-edge/control`, bin/edge's --control): a file in a
# folder only the user the web processes run as may enter, so that nobody else can publish
# (Pushpin's HTTP control port has no authentication and stays off). Empty, there is no edge.
RUNLEDGER_GRIP_URL = _env_list("RUNLEDGER_GRIP_URL", [])


def _grip_key() -> str:
    """The key Pushpin signs its requests to the web processes with (Grip-Sig, HS256) and that they
    check. By default derived from SECRET_KEY, so `bin/edge` and the web processes started with
    the same environment agree without another secret to hand around."""
    key = os.environ.get("RUNLEDGER_GRIP_KEY", "")
    if not key:
        return hmac.new(SECRET_KEY.encode(), b"runledger.grip-key", hashlib.sha256).hexdigest()
    # Pushpin's configuration is an INI file that reads "base64:…" and "file:…" as other kinds of
    # key, and a comma as a list: such a key would not be the one the web processes check.
    if not re.fullmatch(r"[A-Za-z0-9._~+/=-]{32,}", key):
        raise ImproperlyConfigured(
            "RUNLEDGER_GRIP_KEY must be at least 32 characters of A-Z a-z 0-9 . _ ~ + / = - (HS256 wants 32 bytes)"
        )
    return key


RUNLEDGER_GRIP_KEY = _grip_key()
# Seconds between Pushpin's fetches of the link of each stream the edge holds, busy or idle
# (Grip-Link's timeout, spread to half as long again so that streams connected together do not all
# ask at once): the safety net for a publish that never arrived, and the re-check of the stream's
# user (a revoked one keeps an edge stream at most this long, times 1.5). Pushpin's default, 120:
# each fetch is a request to the web processes, so 10,000 streams cost about 70 a second.
RUNLEDGER_GRIP_LINK_SECONDS = _env_int("RUNLEDGER_GRIP_LINK_SECONDS", 120)
# Seconds a publish to Pushpin may take before it counts as failed.
RUNLEDGER_GRIP_PUBLISH_TIMEOUT_SECONDS = _env_float("RUNLEDGER_GRIP_PUBLISH_TIMEOUT_SECONDS", 5)

# Metrics (DESIGN §9, runs/metrics/). RUNLEDGER_METRICS_TOKEN: the bearer token Prometheus scrapes
# `/metrics/` with (`Authorization: Bearer …`); empty, only users with runs.view_run may read them.
RUNLEDGER_METRICS_TOKEN = os.environ.get("RUNLEDGER_METRICS_TOKEN", "")
# How often the staff dashboard (/admin/runs/dashboard/) refreshes its figures in place, in seconds.
RUNLEDGER_DASHBOARD_REFRESH_SECONDS = _env_float("RUNLEDGER_DASHBOARD_REFRESH_SECONDS", 5)


def _metrics_dir() -> str:
    """Where every process on this machine keeps its counters (prometheus-client's multiprocess
    files). By default a folder in the temporary directory named for the user and the database,
    so the web processes and workers of one deployment find the same one with no environment of
    their own, and two deployments (or test runs) on one machine never add up each other's
    counts. RUNLEDGER_METRICS_DIR chooses it (the systemd units must: their /tmp is private)."""
    chosen = os.environ.get("RUNLEDGER_METRICS_DIR")
    if chosen:
        return chosen
    db = DATABASES["default"]
    # Not the URL's options (a web process may add an application_name): which database it is.
    name = os.path.abspath(db["NAME"]) if db["ENGINE"].endswith("sqlite3") else db["NAME"]
    where = f"{db['ENGINE']}|{db.get('HOST', '')}|{db.get('PORT', '')}|{name}"
    digest = hashlib.sha256(where.encode()).hexdigest()[:16]
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return os.path.join(tempfile.gettempdir(), f"runledger-metrics-{uid}-{digest}")


RUNLEDGER_METRICS_DIR = _metrics_dir()
