"""What every web entry of the app shares, owned by none of them (the API, the streams, the probes,
/metrics/, the sign-in pages); it imports nothing above the models and selectors:
    asgi.py            the ASGI wrapper: dispatch by kind of view, body limit, request end, static
    errors.py          the one error shape (docs/design/api.md#errors)
    authentication.py  the token header and the session, read as the API reads them
    throttles.py       failed sign-ins and token attempts, counted and refused beyond the limit
    request_end.py     what a view has called once its request has surely ended
    outbound.py        the address guard every outbound request goes through
"""

# Modules (docs/hooks/reference.py --write keeps this index):
#
#     asgi.py            The app's ASGI wrapper around Django's handler
#     authentication.py  Who a request is, read the same way on every endpoint
#     errors.py          The one error shape, {"error": {"code", "message", "detail"}}, for every
#                        endpoint
#     middleware.py      The middleware of the app's async views in two hops to a thread, not one per
#                        middleware method
#     outbound.py        Requests the platform sends to addresses its users chose (webhooks)
#     request_end.py     What a view has called once its request has surely ended, whatever happened
#                        to it
#     throttles.py       Throttled sign-ins and token attempts
#     token_cache.py     A web process's memory of the API tokens it authenticated
