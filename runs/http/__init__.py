"""What every web entry of the app shares, owned by none of them: the API (runs/api/), the stream
and its edge (runs/streaming/), the probes, /metrics/, the sign-in pages and the ASGI wrapper.
It imports nothing above the models: whatever answers HTTP may build on it.

Modules (docs/hooks/reference.py --write keeps this index):

    authentication.py  Who a request is, read the same way on every endpoint
    errors.py          The one error shape, {"error": {"code", "message", "detail"}}, for every
                       endpoint
    outbound.py        Requests the platform sends to addresses its users chose (webhooks)
    request_end.py     What a view has called once its request has surely ended, whatever happened
                       to it
    throttles.py       Throttled sign-ins and token attempts
"""
