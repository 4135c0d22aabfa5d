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
the services from here.
"""

from runs.services.bulk import MAX_BULK_RUNS, BulkResult, Outcome, runs_cancel_matching, runs_stop_matching
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
from runs.services.idempotency import Answer, Created, answer_once, run_create_idempotent
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
    "MAX_BULK_RUNS",
    "SYSTEM",
    "Answer",
    "BulkResult",
    "CommandResult",
    "Created",
    "MachineAttempts",
    "OrphanedGroups",
    "Outcome",
    "Overrides",
    "PurgeResult",
    "RunSpec",
    "SweepResult",
    "answer_once",
    "attempt_groups_orphaned",
    "run_attempt_group_record",
    "run_attempt_groups_forget",
    "run_attempt_heartbeat",
    "run_attempt_release",
    "run_cancel",
    "run_child_spawn",
    "run_claim",
    "run_complete",
    "run_create",
    "run_create_idempotent",
    "run_deadline_stop",
    "run_events_append",
    "run_fail",
    "run_lease_expire",
    "run_pause",
    "run_requeue",
    "run_rerun",
    "run_resume",
    "run_schedule",
    "run_steps_record",
    "run_stop",
    "run_wait",
    "runs_cancel_matching",
    "runs_purge",
    "runs_stop_matching",
    "runs_sweep",
]
