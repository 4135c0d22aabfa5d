"""A host project that sets no RUNLEDGER_* setting at all: what `django-admin startproject` writes
(less what a check does not look at), the app added as a host adds it, on SQLite in the folder
RUNLEDGER_TEST_HOST_DIR names. Every RUNLEDGER_* setting then comes from the app's registry
(runs/conf.py), as in a project that never heard of them."""

import os
from pathlib import Path

HOME = Path(os.environ["RUNLEDGER_TEST_HOST_DIR"])
SECRET_KEY = "a host project's own secret, for tests only"

INSTALLED_APPS = [
    *("django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes"),
    *("django.contrib.sessions", "django.contrib.messages", "django.contrib.staticfiles"),
    *("rest_framework", "runs"),
]
MIDDLEWARE = [
    f"django.{name}"
    for name in (
        "middleware.security.SecurityMiddleware",
        "contrib.sessions.middleware.SessionMiddleware",
        "middleware.common.CommonMiddleware",
        "middleware.csrf.CsrfViewMiddleware",
        "contrib.auth.middleware.AuthenticationMiddleware",
        "contrib.messages.middleware.MessageMiddleware",
    )
]
_PROCESSORS = ("template.context_processors.request", "contrib.auth.context_processors.auth")
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                f"django.{name}" for name in (*_PROCESSORS, "contrib.messages.context_processors.messages")
            ]
        },
    }
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": HOME / "db.sqlite3"}}
# The two options a host on SQLite gives its database for the app
# (docs/design/deployment.md#sqlite).
DATABASES["default"]["OPTIONS"] = {"transaction_mode": "IMMEDIATE", "timeout": 20}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
STATIC_URL = "static/"
