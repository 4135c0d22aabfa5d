"""Every helper the tests share, one home each; the test files import from here.

    procs.py       real processes: uvicorn and workers (`Procs`, the `procs` fixture), their environment
    browser.py     Debian's Chromium through Playwright: the `chromium` and `browser_page` fixtures
    proxies.py     loopback proxies a test can cut: browser ↔ uvicorn, one process ↔ PostgreSQL
    sse.py         an SSE client over raw sockets, parsing streams as EventSource does
    sse_writer.py  a stand-in worker process that appends events (started by procs.start_writer)
    faults.py      the fault-injection clients: retrying requests, streams followed across reconnects
    checks.py      what must hold of runs once the dust settles, read from the database

Nothing here imports Django's models at module level unless it is only used by tests, so that
bench/ can import the process and client helpers before `django.setup()`.
"""
