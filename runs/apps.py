from django.apps import AppConfig
from django.core import checks


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from runs.agents.loading import check_agents, load_agents
        from runs.api.serializers import RunOutputSerializer
        from runs.conf import check_database, check_environment, check_settings
        from runs.services import webhooks
        from runs.streaming.edge import revocation

        # The webhook body's run is the API's run JSON; the write core must not import the API.
        webhooks.run_json = lambda run: RunOutputSerializer(run).data
        load_agents()
        checks.register(check_agents)
        checks.register(check_settings)
        checks.register(check_environment)
        checks.register(check_database)
        revocation.connect()
