"""Worker processes that execute runs (`manage.py runworker`): claim loop, attempts, tokens, heartbeats."""

# Modules (docs/hooks/reference.py --write keeps this index):
#
#     attempt.py    One attempt of one run, executed by a worker
#     checks.py     What an agent produces, checked in the worker before anything of it is queued for
#                   writing
#     context.py    What an attempt's agent sees of it (`runs.agents.AgentContext`,
#                   docs/design/execution.md#agents)
#     db.py         Database calls from the worker's event loop, on a few dedicated threads in lanes
#     durable.py    Durable steps: `ctx.step` stores a step's result as `step.completed` before it
#                   returns it
#     lease.py      An attempt's lease and the heartbeat that renews it
#     orphans.py    Tool processes whose worker died
#     registry.py   The attempts a worker executes, keyed by run and generation
#     scheduler.py  The worker's scheduler: fires due schedules, exactly once whatever the number of
#                   workers
#     steps.py      The steps an agent takes through its context that cancelling its task cannot stop
#                   by itself
#     webhooks.py   Webhook delivery inside the worker
#     worker.py     The worker: claims queued runs and executes them, at most `concurrency` at a time
#     writer.py     An attempt's writer: what the agent emits, stored in its order

from runs.worker.worker import Worker, default_worker_id

__all__ = ["Worker", "default_worker_id"]
