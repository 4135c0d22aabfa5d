"""Every helper the tests share, each in one place; test files import them from here.

procs.py, browser.py, pg.py, live.py and schedule.py are pytest plugins (conftest.py lists them).
bench/ uses procs, waiting, sse, db and openai_server too; procs, waiting, sse and openai_server
import nothing of Django that needs settings, so bench can import them before `django.setup()`.
"""

# Modules (docs/hooks/reference.py --write keeps this index):
#
#     agents.py              Agents of the tests' own, in a module outside the project as a user's
#                            would be
#     api.py                 The API's error shape, asserted of a test client's response
#     bare_host_settings.py  A host project that sets no RUNLEDGER_* setting at all
#     blackhole_dns.py       A DNS server that never answers, and a process started with it as its
#                            only nameserver
#     browser.py             Real-browser fixtures: Playwright for Python driving Debian's Chromium
#     checks.py              What must hold of runs once the dust settles, read straight from the
#                            database
#     cli.py                 The `runledger` command of the installed client
#     code_settings.py       The standalone site's settings plus values set in code, as a host project
#                            sets its own
#     core_install.py        A process that sees Python as an install of `runledger` without extras
#                            would
#     dashboard.py           What the staff dashboard should show, computed here from every row in
#                            plain Python
#     db.py                  Straight from the database, beside the services
#     deploy.py              Production as an operator runs it (tests/deploy/)
#     descriptions.py        A long description as the package index shows it
#     docs.py                The manual's code, as the tests run it
#     edge.py                Debian's Pushpin in front of web processes, started by `bin/edge` as an
#                            operator would
#     faults.py              Clients for the fault-injection tests (tests/worker/test_faults.py)
#     host.py                A host project of its own, as a Django team that already has a site would
#                            add the app to it
#     host_urls.py           A host project's URLconf by its dotted path, for processes
#     hostile_receiver.py    A webhook receiver that never lets a request finish, in its own process
#     live.py                A live server for the Python client's tests
#     local_files.py         A fresh Python process on settings of its own, for what a process does
#                            once at its start
#     many_runs.py           Many runs at once, for the tests (and benchmarks) that need a crowd
#     memory.py              A process's memory from /proc/<pid>/status
#     metrics.py             `/metrics/` read as Prometheus reads it, and a real Prometheus server
#                            scraping a web process
#     nginx.py               Debian's nginx in front of a web process
#     node.py                The JavaScript package clients/js (@runledger/client) for the tests
#     openai_server.py       An OpenAI-compatible Chat Completions server in a process of its own
#     other_origin.py        An app on another origin than Runledger
#     package.py             The distributions of the checkout, as `python -m build` makes them
#     pg.py                  The suite's own throwaway PostgreSQL cluster, which a test marked
#                            `pg_cluster` may stop and start
#     plain.py               The plain answers beside the DRF views they stand in front of, for the
#                            tests that compare the two
#     ports.py               A free port for a server a test or benchmark is about to start
#     procs.py               Real processes for tests: uvicorn web processes and workers, each stopped
#                            by its PID
#     proxies.py             Loopback proxies that a test can cut
#     raw_http.py            HTTP/1.1 clients over raw sockets that behave as ordinary clients cannot
#     runs.py                A run as the database holds it
#     schedule.py            The order bin/test's parallel workers take the tests in (a pytest plugin;
#                            conftest.py lists it)
#     schema_host.py         A host project's process, with SPECTACULAR_SETTINGS and REST_FRAMEWORK of
#                            its own set in code and the app under tests/support/host_urls.py's prefix
#     seed.py                The seed of the tests that draw at random (cuts, faults, drops)
#     signin.py              Signing in over real HTTP from a chosen loopback address, as a browser
#                            does
#     slow_http.py           A slow streaming HTTP server in a thread of the test process, standing in
#                            for a model server
#     sse.py                 A small SSE client over raw asyncio sockets, for tests and bench/
#     sse_writer.py          A stand-in worker for the SSE tests and benchmarks
#     stock_asgi.py          The standalone site under Django's own ASGI handler, without runs.asgi's
#                            wrapper
#     storage.py             What runs store and what answers carry of them
#     terminal.py            A command run on a pseudo-terminal of its own, answering its prompts as a
#                            person at a keyboard would
#     threads.py             Real threads against the database
#     threads_seen.py        Where a request's synchronous steps run
#     token_cache.py         This process's token cache listening (runs.http.token_cache), as a web
#                            process's lifespan starts it
#     urls.py                Every route a URLconf declares, read from the resolver
#     waiting.py             The one way tests wait: poll a condition against a deadline (never a bare
#                            sleep)
#     webhook_receiver.py    A webhook receiver in its own process, as a user's service would be one
#     webhooks.py            Receivers of webhooks, each a process of its own, as the tests and
#                            benchmarks start them
#     wire.py                What a connection says on the wire (libpq's own trace of the PostgreSQL
#                            protocol)
#     workers.py             Runs that worker processes execute
