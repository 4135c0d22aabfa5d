"""A run's events as SSE (docs/design/streaming.md, docs/design/edge.md): everything of a stream, from its URL to
the bytes on the wire. Follow one request of `GET /api/runs/{id}/stream/` (runs/urls.py):

    views.py      `run_stream`, the plain async view. Behind the edge (`RUNLEDGER_GRIP_URL`) it
                  first hands a connect Pushpin signed to edge/hold.py; any other request is
                  served here:
    checks.py     the checks that open a stream, in the order of docs/design/api.md#check-order, on the hub's opening
                  threads: authentication, visibility, method, cursor, state (401, 404, 405, 400,
                  204); what opened it (`Opened`) is what the guard re-checks later
    guard.py      the user's cap of open streams in this process (429) and the periodic re-check
                  that ends the streams whose user, credential or sight of the run is gone; the
                  edge's streams (`EdgeStreams`) count against the same cap
    hub.py        the per-process hub: one feed per watched run, one shared read per wake-up, the
                  events encoded once as SSE frames (`Frame`), and a poll backstop. The view's body
                  writes those frames, joined into chunks, until the terminal event, the stream's
                  lifetime or the guard's end
    listener.py   the LISTEN connection that wakes the hub's feeds (the worker listens through it
                  too); the channels and payloads themselves are runs/notify.py's, shared with the
                  services that send them
    schema.py     the stream's and the wait's operations in the OpenAPI schema (drf-spectacular
                  cannot see a plain view)
    wait.py       `run_wait`, `GET /api/runs/{id}/wait/`: the run once it ends or waits, on the
                  same checks, cap and wake-ups as a stream
    responses.py  what both answer with (a response that gives its slot back when closed), and
                  both served by a WSGI server (runserver) on a loop of the process's own
    edge/         the Pushpin side (edge/__init__.py walks it): hold.py answers a connect with the
                  replay and hold instructions and Pushpin's fetches of the stream's link, the
                  publisher sends each committed event to Pushpin, which writes it to the clients

A stream writes nothing but the count of a failed token attempt. The error shape, the token and
session credentials and that count are the app's HTTP basics (runs/http/), shared with the API,
the probes, /metrics/ and the sign-in pages.
"""
