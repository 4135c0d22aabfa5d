"""The standalone site's ASGI application: `uvicorn config.asgi:application`.

Django's own, wrapped by `runs.asgi.wrap` (the web process's start around the app's ASGI wrapper,
runs/http/asgi.py), as any host project may apply it; this site also serves its static files when
no web server is in front (embedded default).
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from config.environment import site
from runs.asgi import wrap

application = wrap(get_asgi_application(), serve_static=site.SERVE_STATIC)
