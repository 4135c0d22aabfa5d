"""Every write to runs, events and attempts, one module per job:

- `core`: the locked write core every service is made of (lock, check, append, end, park, requeue);
- `creation`: what a run is made of (`RunSpec`) and its insert;
- `commands`: cancel, stop, pause, resume;
- `bulk`: cancel or stop every run that matches a filter, one run's command at a time;
- `rerun`: an ended run run again, or forked from the middle of its log;
- `scheduling`: a queued run's priority and start time, changed;
- `execution`: the writes of a worker's attempt;
- `sweeper`: lapsed leases and passed deadlines, and where lost attempts' tool processes may be left;
- `idempotency`: retry-safe creates and bulk commands;
- `retention`: purging old terminal runs, and what else outlived its use (idempotency records,
  failed authentications: runs.http.throttles counts those).

Each service on a run is one transaction: lock the run row (`FOR NO KEY UPDATE`), check the transition in
`runs.transitions`, write the run and its event(s) together, and notify at commit. Callers import
the services from here. `__all__` is the public API for host code (docs/reference/python.md); the
other names are the project's own and may change.
"""

# Every service is imported here for the project's own callers; only `__all__` is promised.
# ruff: noqa: F401
from runs.services.bulk import (
    MAX_BULK_RUNS,
    BulkResult,
    Outcome,
    runs_cancel_matching,
    runs_stop_matching,
)
from runs.services.commands import CommandResult, run_cancel, run_pause, run_resume, run_stop
from runs.services.core import SYSTEM
from runs.services.creation import RunSpec, run_create
from runs.services.execution import (
    run_attempt_group_record,
    run_attempt_heartbeat,
    run_attempt_release,
    run_child_spawn,
    run_claim,
    run_complete,
    run_events_append,
    run_fail,
    run_requeue,
    run_steps_record,
    run_wait,
)
from runs.services.idempotency import (
    Answer,
    Created,
    answer_once,
    run_create_idempotent,
)
from runs.services.rerun import Overrides, run_rerun
from runs.services.retention import PurgeResult, runs_purge
from runs.services.scheduling import run_schedule
from runs.services.sweeper import (
    MachineAttempts,
    OrphanedGroups,
    SweepResult,
    attempt_groups_orphaned,
    run_attempt_groups_forget,
    run_deadline_stop,
    run_lease_expire,
    runs_sweep,
)

__all__ = [
    "CommandResult",
    "Overrides",
    "run_cancel",
    "run_create",
    "run_pause",
    "run_rerun",
    "run_resume",
    "run_stop",
]
