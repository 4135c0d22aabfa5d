"""A run's events as SSE, from the URL to the bytes (docs/design/streaming.md, docs/design/edge.md):
    views.py      `run_stream`, the async view: checks, cap, then the hub's frames until the end
    opening.py    the few threads the checks run on, and the breaker that answers 503 at once
    checks.py     the checks that open a stream or a wait (401, 404, 405, 400, 204), in order
    guard.py      the user's cap of open streams (429) and the periodic re-check of their holders
    hub.py        one feed per watched run: one shared read per wake-up, frames encoded once
    wait.py       `run_wait`: the run once it ends or waits, on the same checks, cap and wake-ups
    responses.py  the response that gives its slot back, and both views under a WSGI server
    schema.py     their operations in the OpenAPI schema
    edge/         the Pushpin side (edge/__init__.py walks it)
LISTEN is runs/notify/; the error shape and the credentials, runs/http/.
"""

# Modules (docs/hooks/reference.py --write keeps this index):
#
#     checks.py     The checks that open a stream of a run's events
#     edge/         The SSE edge: Pushpin holds the clients' streams in front of the web processes
#     guard.py      Fair use of the streams a web process serves
#     hub.py        The per-process hub that feeds SSE streams
#     opening.py    The few threads that open streams and waits
#     recent.py     The events notifications a web process heard last, whatever run they were for
#     responses.py  How a stream and a wait answer, under any server
#     schema.py     The SSE stream and the wait in the OpenAPI schema
#     views.py      The SSE stream of a run's events
#     wait.py       A server-side wait: `GET /api/runs/{id}/wait/?timeout=S` answers the run's JSON
#                   plus `wait_result` once the run has ended or waits, else after S seconds
