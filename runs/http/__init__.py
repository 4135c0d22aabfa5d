"""What every web entry of the app shares, owned by none of them: the API (runs/api/), the stream
and its edge (runs/streaming/), the probes, /metrics/, the sign-in pages and the ASGI wrapper.

    errors.py          the one error shape, docs/design/api.md#errors (`error_body`,
                       `error_response`, `error_response_for`)
    authentication.py  the token header (an API token's key) and the session, read as the API reads
                       them, outside DRF's views too
    throttles.py       the failed sign-ins and token attempts, counted per client address (and per
                       username), refused beyond the limit: every token attempt goes through it
    request_end.py     what a view has called once its request has surely ended (the ASGI
                       wrapper calls it)

It imports nothing above the models: whatever answers HTTP may build on it.
"""
