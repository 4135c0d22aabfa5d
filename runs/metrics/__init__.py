"""Prometheus metrics (docs/design/operations.md#metrics): `GET /metrics/`, the counts of every
process, the state read at scrape time.
"""

# Modules (docs/hooks/reference.py --write keeps this index):
#
#     database.py  The state gauges, read from the database at scrape time
#     http.py      HTTP requests by status, counted around the whole ASGI application (runs.asgi)
#     series.py    What the working processes count, each where the work happens
#     store.py     Where a process's counters live
#     views.py     `GET /metrics/`: Prometheus's text format, for the metrics bearer token or a user
#                  who sees every run
