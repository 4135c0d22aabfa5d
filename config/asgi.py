import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

django_application = get_asgi_application()

# A web process without the agents it is configured for would refuse their runs: refuse to start.
from runs.agents.loading import require_agents  # noqa: E402  (needs the configured Django above)

require_agents()

# The embedded deployment has no web server in front to serve the admin's static files.
application: Any
if os.environ.get("RUNLEDGER_SERVE_STATIC", "1") == "1":
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    application = ASGIStaticFilesHandler(django_application)
else:
    application = django_application
