"""Logs (docs/design/operations.md#logs): the run, attempt and worker each line concerns, and one
JSON object per line with `RUNLEDGER_LOG_FORMAT=json` (config/settings.py installs both on the
console handler).

The fields come from the record (`extra={"event": "claimed", "run_id": …}`) or, where the code
runs on behalf of one attempt or one worker, from what `bind_attempt` and `bind_worker` set: an
attempt's task (and the tasks it starts) carries its run, so the lines of the lease, the writer
and the steps name it without passing it along.
"""

import json
import logging
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

FIELDS = ("run_id", "generation", "worker", "event")

_attempt: ContextVar[tuple[str, int] | None] = ContextVar("runledger_attempt", default=None)
# One worker per process: a plain global, so its database threads' lines name it too.
_worker: str | None = None


def bind_worker(worker_id: str) -> None:
    global _worker
    _worker = worker_id


def bind_attempt(run_id: UUID | str, generation: int) -> None:
    """For the rest of the calling task (and the tasks it starts): lines concern this attempt."""
    _attempt.set((str(run_id), generation))


class ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        attempt = _attempt.get()
        if attempt is not None and not hasattr(record, "run_id"):
            record.run_id, record.generation = attempt
        if _worker is not None and not hasattr(record, "worker"):
            record.worker = _worker
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                entry[field] = value if isinstance(value, int) else str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)
