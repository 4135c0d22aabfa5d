"""`manage.py runworker`: a worker process, claiming and executing runs (docs/design/execution.md#claims);
the loop itself is `runs.worker.Worker`."""

import logging
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from runs.agents.loading import require_agents
from runs.conf import conf
from runs.worker import Worker
from runs.worker.db import without_pool

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = (
        "Claim queued runs and execute them until stopped (SIGTERM/SIGINT: finish at safe boundaries); "
        "sweep runs whose lease lapsed or whose deadline passed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="exit once no queued run is left and none is running")
        parser.add_argument("--max-runs", type=int, default=None, help="exit after executing this many runs")
        parser.add_argument(
            "--concurrency", type=int, default=None, help="runs executed at once (default RUNLEDGER_WORKER_CONCURRENCY)"
        )
        parser.add_argument("--worker-id", default=None, help="the id recorded on attempts (default host:pid)")

    def handle(self, *args: Any, **options: Any) -> None:
        # Also under --skip-checks: a worker without its agents would fail every run it claims, and
        # one with settings that cannot work would run them wrongly.
        conf.require()
        require_agents()
        without_pool()
        worker = Worker(
            worker_id=options["worker_id"],
            concurrency=options["concurrency"],
            once=options["once"],
            max_runs=options["max_runs"],
            on_ready=lambda w: self._say(f"runworker {w.worker_id} ready", event="ready"),
        )
        finished = worker.run()
        self._say(f"runworker {worker.worker_id} stopped after {finished} runs", event="stopped")

    def _say(self, message: str, *, event: str) -> None:
        # In JSON logs every line the process writes is a JSON object, these two included (at INFO).
        if conf.LOG_FORMAT == "json":
            log.info(message, extra={"event": event})
        else:
            self.stdout.write(message, ending="\n")
