from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from runs.agents.loading import require_agents
from runs.worker import Worker
from runs.worker.db import without_pool


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
        # Also under --skip-checks: a worker without its agents would fail every run it claims.
        require_agents()
        without_pool()
        worker = Worker(
            worker_id=options["worker_id"],
            concurrency=options["concurrency"],
            once=options["once"],
            max_runs=options["max_runs"],
            on_ready=lambda w: self.stdout.write(f"runworker {w.worker_id} ready", ending="\n"),
        )
        finished = worker.run()
        self.stdout.write(f"runworker {worker.worker_id} stopped after {finished} runs")
