"""A run's events as SSE (docs/design/streaming.md, docs/design/edge.md): everything of a stream, from
its URL to the bytes on the wire. One request of `GET /api/runs/{id}/stream/` (runs/urls.py) goes
views.py → checks.py (on the hub's opening threads) → guard.py (the user's cap, the re-check) →
hub.py (one shared read per wake-up, the frames encoded once) until the terminal event; behind the
edge (`RUNLEDGER_GRIP_URL`) a connect goes to edge/hold.py instead. A stream writes nothing but the
count of a failed token attempt.

Modules (docs/hooks/reference.py --write keeps this index):

    checks.py     The checks that open a stream of a run's events
    edge/         The SSE edge: Pushpin holds the clients' streams in front of the web processes
    guard.py      Fair use of the streams a web process serves
    hub.py        The per-process hub that feeds SSE streams
    listener.py   One PostgreSQL LISTEN connection per process, reconnecting by itself
    responses.py  How a stream and a wait answer, under any server
    schema.py     The SSE stream and the wait in the OpenAPI schema
    views.py      The SSE stream of a run's events
    wait.py       A server-side wait: `GET /api/runs/{id}/wait/?timeout=S` answers the run's JSON
                  plus `wait_result` as soon as the run has ended or waits, else after S seconds
"""
