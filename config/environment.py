"""The standalone site's own `RUNLEDGER_*` environment variables: how it builds its database, its
static files, its secret key and its logging. Not the app's settings (runs/conf.py declares those,
and config/settings.py reads them from the environment too); declared, read and refused in the
same way, with the same kinds.
"""

import os
from pathlib import Path

from runs.setting_kinds import SERVING, WEB, Flag, Registry, Seconds, Text, Whole

BASE_DIR = Path(__file__).resolve().parent.parent


class Site(Registry):
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
