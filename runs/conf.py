"""The settings registry: every `RUNLEDGER_*` setting of the app, declared once, with its kind,
default, processes and doc (docs/design/deployment.md#settings).

The app reads each through `conf` (`conf.LEASE_SECONDS`), a project's default where unset; one
validation (`problems`) serves the system check `runs.E002` and `conf.require()` at each process's
start; `settings_from_environment()` takes the variables for a settings module; the docs' table is
`AppSettings.reference()`.
"""

import hashlib
import hmac
import os
import tempfile
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core import checks

from runs.intervals import AttemptConfig
from runs.setting_kinds import (
    EDGE,
    SERVING,
    WEB,
    WORKER,
    Flag,
    Limit,
    Names,
    Registry,
    Seconds,
    Text,
    Url,
    Whole,
    is_network,
    is_socket_url,
    pattern,
)


def _grip_key() -> str:
    # Derived from the secret key, so `runedge` and the web processes started with the same
    # environment agree without another secret to hand around.
    return hmac.new(settings.SECRET_KEY.encode(), b"runledger.grip-key", hashlib.sha256).hexdigest()


def _metrics_dir() -> str:
    # Named for the user and the database (not the URL's options: which database it is), so one
    # deployment's processes find the same folder with no environment of their own, and two
    # deployments (or test runs) on one machine never add up each other's counts.
    db = settings.DATABASES["default"]
    name = os.path.abspath(db["NAME"]) if db["ENGINE"].endswith("sqlite3") else db["NAME"]
    where = f"{db['ENGINE']}|{db.get('HOST', '')}|{db.get('PORT', '')}|{name}"
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return os.path.join(
        tempfile.gettempdir(), f"runledger-metrics-{uid}-{hashlib.sha256(where.encode()).hexdigest()[:16]}"
    )


class AppSettings(Registry):
    # Agents (docs/design/execution.md#agents)
    AGENTS = Names(
        ["runs.agents.demo"],
        "the modules that register agents, imported by every web process and worker at start",
        SERVING,
        must="a list of module paths",
        item=pattern(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*"),
    )
    # Leases and intervals (docs/design/execution.md#leases); the lease must outlast a heartbeat and
    # the unwinding (runs.intervals).
    LEASE_SECONDS = Seconds(
        30, "how long a worker's hold on a run lasts unless renewed; then another may take it", SERVING
    )
    HEARTBEAT_SECONDS = Seconds(10, "how often a worker renews the lease of each run it executes", (WORKER,))
    CANCEL_GRACE_SECONDS = Seconds(
        0.5,
        "how long a stopped run's agent, tools and threads get to stop, then are abandoned",
        (WORKER,),
        zero="at once",
    )
    POLL_SECONDS = Seconds(2, "how often the database is read again on PostgreSQL, behind its notifications", SERVING)
    SQLITE_POLL_SECONDS = Seconds(
        0.2, "how often workers and streams look for news on SQLite (no notifications)", SERVING
    )
    SWEEP_SECONDS = Seconds(
        5, "how often each worker requeues runs whose lease lapsed and stops runs past their deadline", (WORKER,)
    )
    SHUTDOWN_GRACE_SECONDS = Seconds(
        10, "how long a stopping worker's runs get to reach a safe boundary", (WORKER,), zero="at once"
    )
    LISTEN_RECONNECT_SECONDS = Seconds(0.5, "the wait before a lost LISTEN connection is opened again", SERVING)
    APPEND_BATCH_MAX = Whole(
        200, "the most events one append transaction carries; the rest wait for the next", (WORKER,)
    )
    IDEMPOTENCY_TTL_SECONDS = Whole(
        86_400,
        "how long a create's Idempotency-Key replays its first success",
        (WEB,),
        minimum=0,
        unit="seconds",
        zero="none",
    )
    DEFAULT_MAX_ATTEMPTS = Whole(3, "attempts a run created without max_attempts may lose to lapsed leases", SERVING)
    # Streams (docs/design/streaming.md)
    SSE_KEEPALIVE_SECONDS = Seconds(15, "how often an idle stream sends a keep-alive comment", (WEB,))
    SSE_RETRY_MS = Whole(
        2000, "the stream's `retry:`, how long EventSource waits to reconnect", (WEB,), minimum=0, unit="milliseconds"
    )
    SSE_MAX_SECONDS = Seconds(
        300, "a stream's life; it then ends cleanly and the client resumes", (WEB,), zero="unlimited"
    )
    SSE_RECHECK_SECONDS = Seconds(5, "how often an open stream's user, credential and run are checked again", (WEB,))
    SSE_START_SECONDS = Seconds(
        5,
        "how long a stream's slot waits for its body to start before it is given back "
        "(a client gone before the first byte, under an ASGI handler that does not say so)",
        (WEB,),
    )
    # Limits, so one user cannot take the service from everyone else
    # (docs/design/fair-use.md#limits)
    MAX_ACTIVE_RUNS_PER_USER = Limit(
        1000, "queued + running + waiting runs one user owns; a create beyond is a 429", (WEB,)
    )
    # Ten times the active cap: a busy user's history of many days between purges.
    MAX_RUNS_PER_USER = Limit(10_000, "runs one user keeps, finished ones too, until purge_runs deletes them", (WEB,))
    # 1 GB: a full 10,000 runs of 100 kB each, while a few users cannot fill a disk. Agents' events are
    # bounded by each run's budgets, never refused by this.
    MAX_STORED_BYTES_PER_USER = Limit(
        1_000_000_000, "bytes of JSON one user's runs store; a create or resume that would pass it is a 429", (WEB,)
    )
    MAX_RUNNING_PER_USER = Limit(0, "runs of one owner the workers run at once; the others wait, queued", SERVING)
    MAX_STREAMS_PER_USER = Limit(
        20, "streams (and server-side waits) one user holds at once on one web process; beyond is a 429", (WEB,)
    )
    # 4 MB: an answer stays under 5 MB with its envelope, and a web process's threads and stream
    # readers hold at most a few hundred MB between them.
    MAX_PAGE_BYTES = Limit(
        4_000_000, "bytes of events one page or one read of a stream's replay carries (one event at least)", (WEB,)
    )
    # A 500-run page is then under 5 MB even with each value doubled by escaping, and most inputs (an
    # agent's options) fit.
    MAX_LIST_VALUE_BYTES = Limit(
        1000, "the size up to which a run in a list carries its input, output and error", (WEB,)
    )
    # deploy/nginx.conf.template's client_max_body_size repeats this default (change both together);
    # the standalone site gives it to Django too (DATA_UPLOAD_MAX_MEMORY_SIZE, 2.5 MB by default).
    MAX_BODY_BYTES = Whole(
        256 * 1024, "the largest request body (larger is a 413), and the largest input or event data stored", SERVING
    )
    DEFAULT_MAX_EVENTS = Limit(100_000, "the events budget of a run created without one", (WEB,), zero="none")
    DEFAULT_MAX_STEPS = Limit(10_000, "the steps budget of a run created without one", (WEB,), zero="none")
    DEFAULT_DEADLINE_SECONDS = Limit(
        86_400, "the deadline of a run created without one", (WEB,), unit="seconds", zero="none"
    )
    # API tokens (docs/design/api.md#tokens): rows a user makes, so bounded like their runs.
    MAX_TOKENS_PER_USER = Limit(50, "API tokens one user holds, expired ones until deleted; the next is a 429", (WEB,))
    AUTH_FAILURES_MAX = Limit(10, "failed sign-ins and token attempts allowed per window; beyond is a 429", (WEB,))
    AUTH_FAILURE_WINDOW_SECONDS = Whole(
        300, "the window failed sign-ins and token attempts count in", (WEB,), unit="seconds"
    )
    # A web process's memory of API tokens it authenticated (docs/design/api.md#token-cache): a
    # revocation drops them at once by its notification; this bounds one whose notification is lost.
    TOKEN_CACHE_SECONDS = Seconds(
        5,
        "how long a web process may authenticate an API token from memory; revocations drop it at once",
        (WEB,),
        zero="no cache: every request reads its token",
    )
    LIMIT_RETRY_AFTER_SECONDS = Whole(
        10, "the Retry-After of a refused create, resume or stream", (WEB,), unit="seconds"
    )
    # Processes
    WEB_THREADS = Whole(32, "threads a web process serves its synchronous views (API, admin, pages) on", (WEB,))
    WORKER_CONCURRENCY = Whole(4, "runs one worker executes at once (runworker --concurrency overrides it)", (WORKER,))
    # So that one user's long runs cannot keep everyone else's queued until they end. 1: another user's
    # run starts at once on the default install (4 slots), at the cost of one slot a lone user cannot fill.
    WORKER_NEWCOMER_SLOTS = Whole(
        1,
        "slots of each worker kept for owners with no run running (two stay open to everyone)",
        (WORKER,),
        minimum=0,
        zero="none kept",
    )
    # Behind a transaction-pooling PgBouncer LISTEN does not work: workers then poll alone.
    WORKER_LISTEN = Flag(True, "whether workers wake on LISTEN/NOTIFY on PostgreSQL; 0: they poll alone", (WORKER,))
    # Hot statements prepared per connection (docs/design/deployment.md#prepared); off for a pooler
    # that cannot carry protocol-level prepared statements (PgBouncer before 1.21, or without
    # max_prepared_statements in transaction pooling).
    PREPARED_STATEMENTS = Flag(
        True, "whether the hot statements are sent prepared on PostgreSQL; 0: each is parsed every time", SERVING
    )
    # None by default: a tool runs an agent's (a model's) choice of commands, and the worker's
    # environment holds its secrets (runs/worker/steps.py TOOL_ENV lists the few every tool gets).
    TOOL_ENV = Names(
        [],
        "the worker's environment variables its agents' tool processes get, beside PATH, HOME, LANG and the like",
        (WORKER,),
        must="a list of environment variable names",
        item=pattern(r"[A-Za-z_][A-Za-z0-9_]*"),
    )
    # The `openai_chat` agent (runs.agents.openai_chat)
    OPENAI_BASE_URL = Url("https://api.openai.com/v1", "the OpenAI-compatible Chat Completions endpoint", (WORKER,))
    OPENAI_API_KEY = Text("", "its API key; empty sends no Authorization header", (WORKER,), secret=True)
    OPENAI_MAX_TOKENS = Limit(
        4096, "the largest max_tokens a run may ask for, and what one that names none gets", SERVING, zero="no bound"
    )
    OPENAI_CONTINUE = Flag(
        False, "whether runs that do not say continue a requeued answer in place (vLLM only)", (WORKER,)
    )
    # The SSE edge (docs/design/edge.md, runs.streaming.edge)
    # Each a file in a folder only the web processes' user may enter, so nobody else can publish;
    # Pushpin's HTTP control port has no authentication and stays off (runs.streaming.edge.control).
    GRIP_URL = Names(
        [],
        "each Pushpin's control socket, where web processes publish (bin/edge --control PATH); empty: no edge",
        (WEB,),
        must="a list of ipc:///PATH URLs (a path of at most 107 bytes)",
        item=is_socket_url,
    )
    GRIP_KEY = Text(
        _grip_key,
        "the key Pushpin signs its requests to the web processes with",
        (WEB, EDGE),
        shown="derived from SECRET_KEY",
        # Pushpin's configuration reads "base64:…" and "file:…" as other kinds of key, and a comma as a list.
        pattern=r"[A-Za-z0-9._~+/=-]{32,}",
        must="at least 32 characters of A-Z a-z 0-9 . _ ~ + / = - (HS256 wants 32 bytes)",
        secret=True,
    )
    # The safety net for a publish that never arrived, and the re-check of the stream's user when the
    # publisher's close of a revoked one did not come (docs/design/edge.md#revocation). Each fetch is
    # a request to the web processes and costs Pushpin about as much as a hundred deliveries: 10,000
    # streams fetched every 120 s (Pushpin's default) cost more than delivering them an event each 2 s.
    GRIP_LINK_SECONDS = Whole(
        600, "how often Pushpin fetches each edge stream's link again (1 to 1.5 times that)", (WEB,), unit="seconds"
    )
    # Until then a stream counts against its user's cap whether or not its client is still there.
    GRIP_LINK_FIRST_SECONDS = Whole(
        120,
        "when Pushpin first fetches an edge stream's link after its connect (1 to 1.5 times that), if sooner"
        " and streams are capped",
        (WEB,),
        unit="seconds",
    )
    GRIP_PUBLISH_TIMEOUT_SECONDS = Seconds(5, "how long one publish to Pushpin may take", (WEB,))
    # A stream whose hold reached Pushpin after its run's close is told by the close sent again
    # (docs/design/edge.md#late-holds): the longer, the later a hold it catches, and the longer such a
    # stream waits for its end.
    GRIP_CLOSE_AGAIN_SECONDS = Seconds(
        5, "how long after a run's end the publisher closes its edge streams again, for streams held late", (WEB,)
    )
    # Webhooks (docs/design/webhooks.md)
    WEBHOOKS_TIMEOUT_SECONDS = Seconds(5, "how long one webhook request may take, connecting included", (WORKER,))
    WEBHOOKS_RETRY_BASE_SECONDS = Seconds(
        5, "the wait before a failed webhook delivery's first retry (doubled each time, with jitter)", (WORKER,)
    )
    WEBHOOKS_RETRY_MAX_SECONDS = Seconds(3600, "the longest wait between two retries of a delivery", (WORKER,))
    WEBHOOKS_GIVE_UP_SECONDS = Seconds(
        86_400, "how long a delivery is retried after its event; then it is marked failed", (WORKER,)
    )
    WEBHOOKS_DISABLE_AFTER_SECONDS = Seconds(
        3 * 86_400, "how long an endpoint may fail every attempt before it is disabled, with the reason", (WORKER,)
    )
    WEBHOOKS_ROTATION_OVERLAP_SECONDS = Seconds(
        86_400, "how long a rotated-out signing secret still signs deliveries beside the new one", (WEB,)
    )
    WEBHOOKS_BATCH = Whole(
        20, "webhook requests one worker has in flight at once; a slot freed is claimed again at once", (WORKER,)
    )
    WEBHOOKS_ALLOW_PRIVATE = Flag(
        False,
        "whether webhooks may go to loopback, private, link-local and metadata addresses (tests, private networks)",
        SERVING,
    )
    # Applied whatever WEBHOOKS_ALLOW_PRIVATE says: a private deployment still keeps its own ranges
    # (its database's subnet, the metadata address) out of reach (docs/design/webhooks.md#safe-requests).
    WEBHOOKS_DENY = Names(
        [],
        "CIDR ranges webhooks never go to, checked with the IPv4 address an IPv6 one embeds, even when "
        "RUNLEDGER_WEBHOOKS_ALLOW_PRIVATE is on",
        SERVING,
        must="a list of CIDR ranges (10.0.0.0/8, fd00::/8)",
        item=is_network,
    )
    # 20: a user's services and their environments; it bounds the delivery rows one event of theirs
    # writes, and the endpoints one user can point at receivers that hang (docs/design/webhooks.md).
    MAX_WEBHOOKS_PER_USER = Limit(20, "webhook endpoints one user may register; the next is a 429", (WEB,))
    # A week: long enough to answer "was it sent?" about a run already purged.
    WEBHOOKS_KEEP_DAYS = Whole(
        7,
        "days purge_runs keeps a delivered notification after its delivery, even when its run is purged",
        (WEB,),
        minimum=0,
        unit="days",
    )
    # Stands in for DNS where a test needs a name to resolve, and to change, as it says.
    WEBHOOKS_RESOLVE_OVERRIDES = Names(
        [],
        "host=address pairs webhook requests resolve those hosts to, before DNS (for tests)",
        SERVING,
        must="a list of host=address pairs",
        item=pattern(r"[^=\s]+=[0-9A-Fa-f.:]+"),
    )
    # Schedules (docs/design/schedules.md): rows a user makes, each firing runs that count as theirs.
    MAX_SCHEDULES_PER_USER = Limit(100, "schedules one user may have; the next is a 429", (WEB,))
    # A minute: what a five-field cron allows at most, and a bound on the runs one schedule makes.
    MIN_SCHEDULE_SECONDS = Whole(
        60,
        "the shortest interval between a schedule's due times, unless its owner holds runs.schedule_often",
        (WEB,),
        minimum=0,
        unit="seconds",
        zero="no minimum",
    )
    # Behind the schedules' notification: a missed one (a restart of PostgreSQL) costs at most this.
    SCHEDULER_POLL_SECONDS = Seconds(
        2, "the longest a worker's scheduler sleeps before it looks for due schedules again", (WORKER,)
    )
    # Operations (docs/design/operations.md)
    METRICS_TOKEN = Text(
        "", "the bearer token for /metrics/; empty: only users with runs.view_run", (WEB,), secret=True
    )
    # The systemd units must choose it: their /tmp is private.
    METRICS_DIR = Text(
        _metrics_dir,
        "where this machine's processes keep their metrics counters",
        SERVING,
        pattern=r".+",
        must="a path",
        shown="a folder in the temporary directory named for the user and the database",
    )
    # The host project (docs/design/deployment.md#settings)
    HARDEN_ADMIN = Flag(
        False,
        "also guard every other admin of the site (users, groups) against hostile list URLs; the run admin always is",
        (WEB,),
    )
    DASHBOARD_REFRESH_SECONDS = Seconds(5, "how often the staff dashboard refreshes its figures", (WEB,))
    LOG_FORMAT = Text(
        "text", "json: one JSON object per log line (runs.logs)", SERVING, pattern="text|json", must="text or json"
    )

    def attempt_config(self) -> AttemptConfig:
        """An attempt's lease timing, as these settings say (`problems` tells whether it works)."""
        return AttemptConfig(
            heartbeat_seconds=self.HEARTBEAT_SECONDS,
            lease_seconds=self.LEASE_SECONDS,
            cancel_grace_seconds=self.CANCEL_GRACE_SECONDS,
            batch_max=self.APPEND_BATCH_MAX,
        )

    def rule_problems(self) -> list[str]:
        lease = self.attempt_config().problem()
        return [] if lease is None else [lease]


conf = AppSettings()


def settings_from_environment(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The app's settings that the environment (`environ`, else `os.environ`) sets, by the
    `RUNLEDGER_*` variables of the same names, for a project's settings module to take — last, so
    that the environment wins over what the module set before:

        globals().update(settings_from_environment())

    A value its setting cannot take raises ImproperlyConfigured naming the variable, so every
    command stops at settings load, `check` and the servers too; one not set (or empty) leaves the
    setting to the module or the app's default. The standalone site (config/settings.py) reads its
    environment this way (docs/design/deployment.md#settings)."""
    return AppSettings(os.environ if environ is None else environ).given()


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return [checks.Error(problem, id="runs.E002") for problem in conf.problems()]


def check_environment(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """`RUNLEDGER_*` variables whose value is not the settings': the app reads Django's settings, never
    its environment, so a project that does not take them (`settings_from_environment`) ignores
    them. Names only: a value may be a secret."""
    ignored = conf.ignored(os.environ)
    if not ignored:
        return []
    return [
        checks.Warning(
            f"{', '.join(ignored)} {'is' if len(ignored) == 1 else 'are'} set in the environment, and ignored: the "
            "app reads Django's settings, which give another value",
            hint="Set them in settings.py, or take the environment there, last: "
            "`from runs.conf import settings_from_environment` and "
            "`globals().update(settings_from_environment())`",
            id="runs.W001",
        )
    ]


# What the app needs of a SQLite database (docs/design/deployment.md#sqlite): every write
# transaction takes the write lock at BEGIN, so read-check-write commands queue instead of failing
# with "database is locked" when they upgrade, and a busy database is waited for, not refused at
# once.
def check_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return sqlite_problems(settings.DATABASES)


def sqlite_problems(databases: dict[str, Any]) -> list[checks.CheckMessage]:
    found: list[checks.CheckMessage] = []
    for alias, db in databases.items():
        if not db.get("ENGINE", "").endswith("sqlite3"):
            continue
        options = db.get("OPTIONS", {})
        missing = []
        if str(options.get("transaction_mode", "")).upper() != "IMMEDIATE":
            missing.append('"transaction_mode": "IMMEDIATE"')
        if not isinstance(options.get("timeout"), int | float) or options["timeout"] <= 0:
            missing.append('"timeout": 20 (seconds)')
        if missing:
            found.append(
                checks.Error(
                    f"DATABASES[{alias!r}] is SQLite without {' and '.join(missing)} in its OPTIONS",
                    hint="Runledger's commands read, check and write in one transaction: without these, two at "
                    "once fail with 'database is locked' instead of waiting their turn",
                    id="runs.E003",
                )
            )
    return found
