"""Worker processes that execute runs (`manage.py runworker`): claim loop, attempts, tokens, heartbeats."""

from runs.worker.worker import Worker, default_worker_id

__all__ = ["Worker", "default_worker_id"]
