"""The app's start (docs/design/deployment.md): its agents loaded, its system checks registered, the
streams of revoked credentials ended wherever they are held, and a user's change announced to the
web processes' token caches."""

from django.apps import AppConfig
from django.core import checks


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from runs.agents.loading import check_agents, load_agents
        from runs.conf import check_database, check_environment, check_settings
        from runs.http import token_cache
        from runs.streaming.edge import revocation

        load_agents()
        checks.register(check_agents)
        checks.register(check_settings)
        checks.register(check_environment)
        checks.register(check_database)
        revocation.connect()
        token_cache.connect()
