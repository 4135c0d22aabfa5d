"""Prometheus metrics (docs/design/operations.md#metrics): `store` (where each process's counts
live), `series` (what the working processes count), `database` (state read at scrape time), `http`
(requests by status), `views` (`GET /metrics/`)."""
