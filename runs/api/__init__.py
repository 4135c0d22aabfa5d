"""The REST API (docs/design/api.md): DRF views that validate their input, call one service or
selector, and serialise the result; every error in the one error shape.
"""

# Modules (docs/hooks/reference.py --write keeps this index):
#
#     apis.py             The REST API: one class per operation, each validating its input, calling
#                         one service or selector
#     authentication.py   How programs authenticate with the API
#     base.py             What every view of the API is, whatever the host project's `REST_FRAMEWORK`
#                         says
#     bulk.py             `POST /api/runs/cancel/` and `POST /api/runs/stop/`
#     errors.py           The API's errors in the one error shape, + "run" on 409s
#     filters.py          The lists' query parameters
#     objects.py          What the collections of a caller's objects (schedules, webhook endpoints,
#                         API tokens) do alike
#     pagination.py       Cursor-paged lists: `{"next", "previous", "results"}`, keyset pages in the
#                         list's unique order
#     parsers.py          The one request parser of the API
#     plain.py            Hot requests answered without DRF's request cycle
#     rerun.py            `POST /api/runs/{id}/rerun/`
#     schedules.py        `/api/schedules/`: the caller's schedules — created, listed, read, changed,
#                         deleted, paused, resumed
#     schema.py           The app's OpenAPI schema: the view that serves it on the app's own settings
#                         whatever the project's
#     schema_settings.py  The OpenAPI schema's settings, the app's own
#     serializers.py      Output shapes shared by several API operations
#     tokens.py           `/api/tokens/`: the caller's own API tokens — issued, listed, revoked
#     urls.py             The API's URLs, one operation class per URL
#     webhooks.py         `/api/webhooks/`: the caller's webhook endpoints, their secret's rotation
#                         and their deliveries
