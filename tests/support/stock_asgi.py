"""The standalone site under Django's own ASGI handler, without runs.asgi's wrapper: what a host
project's stock `asgi.py` serves. The app must be correct under it, only slower."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

application = get_asgi_application()
