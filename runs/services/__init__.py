"""Every write, one module per job, each service importable from here (docs/layout.md): `core` the
locked write core (lock, check, append, end, park, requeue); `creation`, `commands`, `bulk`,
`rerun`, `scheduling` what callers ask of runs; `execution` a worker's writes; `sweeper`,
`retention`, `idempotency`; `quotas` the owner's limits and the fair-share pick, `ranking` the
order of owners it reads; `tokens`, `webhook_endpoints`, `webhooks` (the outbox). One transaction
under the run's row lock each (docs/design/commands.md). `__all__` is the public API for host
code (docs/reference/python.md); the other names are the project's own and may change.
"""

# Modules (docs/hooks/reference.py --write keeps this index):
#
#     bulk.py               Cancel or stop every run that matches a filter
#     commands.py           The commands people and programs send a run
#     core.py               The locked write core every service is made of
#     creation.py           Creating runs: what a new run is made of (`RunSpec`), its checks, and its
#                           insert
#     execution.py          The writes of a worker's attempt
#     firing.py             Firing schedules: each due time's run created through the normal create
#                           path
#     idempotency.py        Retry-safe creates: at most one run per
#     locks.py              Locking a run for a command
#     quotas.py             Per-owner limits, enforced where runs are made and claimed
#     ranking.py            The order claims serve owners in, as SQL
#     rerun.py              Running an ended run again, and forking it from the middle of its log
#     retention.py          Retention: deleting old terminal runs with their events and attempts
#     schedule_notices.py   What a schedule tells webhooks
#     schedules.py          Schedules created, changed, paused, resumed, triggered, backfilled and
#                           deleted
#     scheduling.py         Changing when a queued run may start and how it ranks
#     statements.py         Statements written plainly and sent together
#     sweeper.py            The sweeper every worker runs
#     tokens.py             API tokens issued and revoked
#     webhook_endpoints.py  Webhook endpoints registered, changed, rotated and deleted
#     webhooks.py           The webhook outbox: a notification written in the transaction of the event
#                           it reports

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
from runs.services.quotas import check_create, check_stored_bytes, check_webhooks, owned, pick_queued
from runs.services.rerun import Overrides, run_rerun
from runs.services.retention import PurgeResult, runs_purge
from runs.services.schedules import (
    schedule_backfill,
    schedule_create,
    schedule_delete,
    schedule_pause,
    schedule_resume,
    schedule_trigger,
    schedule_update,
)
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
from runs.services.tokens import MAX_LIFETIME, token_create, token_delete
from runs.services.webhook_endpoints import (
    webhook_create,
    webhook_delete,
    webhook_rotate_secret,
    webhook_update,
)
from runs.services.webhooks import (
    deliveries_claim,
    deliveries_record,
    deliveries_redeliver,
    delivery_record,
    enqueue,
    lease_seconds,
    retry_delay,
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
