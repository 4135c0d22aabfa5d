"""Every helper the tests share, each in one place; test files import them from here.

    procs.py       real processes: `Procs` and the `procs` fixture (uvicorn on a port or a Unix
                   socket, Django's runserver, workers, the SSE writer), the environment they get, waits for their
                   readiness, /proc figures, a script run as another local user
    waiting.py     wait_until: poll a condition against a deadline
    threads.py     race and in_thread: real threads on their own database connections
    runs.py        a run as the database holds it: fresh, attempt, event_types, stored_text, ...
    workers.py     runs that worker processes execute: wait_status, wait_streaming, ...
    agents.py      the tests' own agents, loaded like a user's (AGENTS_ENV): a planner with its own
                   event type, a child process deaf to SIGTERM, an HTTP stream, a usage report at stop
    slow_http.py   a slow streaming HTTP server in a thread that records when its client went away
    openai_server.py  an OpenAI-compatible streaming model server, a process of its own (ModelServer
                   starts it): behaviours chosen by the model name, every request, chunk and
                   disconnect in a JSON-lines log
    checks.py      what must hold of runs once the dust settles (also after a fault-injection run)
    api.py         the API's error shape, asserted of a test client's response
    urls.py        every route the project's URLconf (or a part of it) declares; a host's URLconf
                   with the app under a prefix (host_urls.py: the one processes name, at tools/agents/)
    schema_host.py a host's process whose own schema settings must not reach the app's schema,
                   asked from several threads at once (CODE_SETTINGS: code_settings.py)
    db.py          API tokens (and DRF's table of an earlier install), a backup of the test database
                   (pg_dump, the SQLite files), what PostgreSQL reports: LISTEN connections, scans
    pg.py          the suite's own PostgreSQL cluster and the `pg_cluster` fixture
    sse.py         an SSE client over raw sockets that parses streams as EventSource does
    sse_writer.py  a stand-in worker process that appends events (procs.start_writer starts it)
    proxies.py     loopback proxies a test can cut: browser (or Pushpin) -> uvicorn, which can also
                   keep chosen answers until released; one process -> PostgreSQL
    nginx.py       Debian's nginx started from deploy/nginx.conf.template in front of a web process
                   (on a port or a Unix socket), and the front door's folder as systemd-tmpfiles makes it
    edge.py        Debian's Pushpin started by bin/edge in front of web processes, a tap on its
                   control socket that loses a chosen publish, and an attacker's tools (a real
                   Grip-Sig, its TCP ports, a forger run as another user, a stalled body)
    raw_http.py    clients over raw sockets: a large upload that notes when the answer came, a
                   slowloris that never finishes its headers, a request from another loopback address
                   or to a Unix socket
    browser.py     Debian's Chromium through Playwright: the `browser_page` fixture and its helpers,
                   PageLoads (every stylesheet and script a page asked for answered 200, no console error)
    other_origin.py  an app on another origin: one plain page (other_origin.html) that calls
                   Runledger with fetch, or the files of a built app, served by a tiny HTTP server
                   of its own
    host.py        a host project of its own: a fresh virtualenv with the built wheel, startproject,
                   the lines docs/how-to/embed.md adds, its processes; the guide's shell steps run
                   as a reader types them (follow_the_guide)
    terminal.py    a command on a pseudo-terminal of its own, its prompts answered (createsuperuser)
    faults.py      the fault-injection clients: retrying requests, streams followed across drops
    docs.py        the manual's code blocks by title, a shell that runs a page's shell blocks, the
                   reference pages' renderer (docs/hooks/reference.py) and their generated parts
    node.py        the TypeScript package (clients/js): installed from its lock and built once for any
                   number of test processes, under a file lock; its node tests run with a live server's
                   URLs and tokens in their environment; its React example app bundled (built_example)
    package.py     the checkout's wheels and sdists (the app's, the client's) as `python -m build`
                   makes them, and their contents; core_install: a process where the extras cannot be
                   imported (core_install.py), under a host's settings on SQLite (bare_host_settings.py),
                   noting who tries
    descriptions.py  a long description as the package index renders it: its links, those that lead
                   nowhere there, the checkout's file a link into the repository names
    schedule.py    the order the parallel workers take the tests in: process modules first
    webhooks.py    webhook receivers, each a process: Receiver (webhook_receiver.py, which verifies every
                   request with the standardwebhooks package and logs it) and Hostile
                   (hostile_receiver.py: a receiver that hangs, or drips its answer a byte at a time)
    blackhole_dns.py  a DNS server that never answers, and a command run with it as its only nameserver

procs.py, browser.py, pg.py, live.py and schedule.py are pytest plugins (conftest.py lists them).
bench/ uses procs, waiting, sse, db and openai_server too; procs, waiting, sse and openai_server import nothing of
Django that needs settings, so bench can import them before `django.setup()`.

Modules (docs/hooks/reference.py --write keeps this index):

    agents.py              Agents of the tests' own, in a module outside the project as a user's
                           would be
    api.py                 The API's error shape, asserted of a test client's response
    bare_host_settings.py  A host project that sets no RUNLEDGER_* setting at all
    blackhole_dns.py       A DNS server that never answers, and a process started with it as its
                           only nameserver
    browser.py             Real-browser fixtures: Playwright for Python driving Debian's Chromium
    checks.py              What must hold of runs once the dust settles, read straight from the
                           database
    cli.py                 The `runledger` command of the installed client
    code_settings.py       The standalone site's settings plus values set in code, as a host project
                           sets its own
    core_install.py        A process that sees Python as an install of `runledger` without extras
                           would
    dashboard.py           What the staff dashboard should show, computed here from every row in
                           plain Python
    db.py                  Straight from the database, beside the services
    descriptions.py        A long description as the package index shows it
    docs.py                The manual's code, as the tests run it
    edge.py                Debian's Pushpin in front of web processes, started by `bin/edge` as an
                           operator would
    faults.py              Clients for the fault-injection tests (tests/test_faults.py)
    host.py                A host project of its own, as a Django team that already has a site would
                           add the app to it
    host_urls.py           A host project's URLconf by its dotted path, for processes
    hostile_receiver.py    A webhook receiver that never lets a request finish, in its own process
    live.py                A live server for the Python client's tests
    local_files.py         A fresh Python process on settings of its own, for what a process does
                           once at its start
    many_runs.py           Many runs at once, for the tests (and benchmarks) that need a crowd
    memory.py              A process's memory from /proc/<pid>/status
    metrics.py             `/metrics/` read as Prometheus reads it, and a real Prometheus server
                           scraping a web process
    nginx.py               Debian's nginx in front of a web process
    node.py                The JavaScript package clients/js (@runledger/client) for the tests
    openai_server.py       An OpenAI-compatible Chat Completions server in a process of its own
    other_origin.py        An app on another origin than Runledger
    package.py             The distributions of the checkout, as `python -m build` makes them
    pg.py                  The suite's own throwaway PostgreSQL cluster, which a test marked
                           `pg_cluster` may stop and start
    procs.py               Real processes for tests: uvicorn web processes and workers, each stopped
                           by its PID
    proxies.py             Loopback proxies that a test can cut
    raw_http.py            HTTP/1.1 clients over raw sockets that behave as ordinary clients cannot
    runs.py                A run as the database holds it
    schedule.py            The order bin/test's parallel workers take the tests in (a pytest plugin;
                           conftest.py lists it)
    schema_host.py         A host project's process, with SPECTACULAR_SETTINGS and REST_FRAMEWORK of
                           its own set in code and the app under tests/support/host_urls.py's prefix
    seed.py                The seed of the tests that draw at random (cuts, faults, drops)
    signin.py              Signing in over real HTTP from a chosen loopback address, as a browser
                           does
    slow_http.py           A slow streaming HTTP server in a thread of the test process, standing in
                           for a model server
    sse.py                 A small SSE client over raw asyncio sockets, for tests and bench/
    sse_writer.py          A stand-in worker for SSE tests
    stock_asgi.py          The standalone site under Django's own ASGI handler, without runs.asgi's
                           wrapper
    storage.py             What runs store and what answers carry of them
    terminal.py            A command run on a pseudo-terminal of its own, answering its prompts as a
                           person at a keyboard would
    threads.py             Real threads against the database
    urls.py                Every route a URLconf declares, read from the resolver
    waiting.py             The one way tests wait: poll a condition against a deadline (never a bare
                           sleep)
    webhook_receiver.py    A webhook receiver in its own process, as a user's service would be one
    webhooks.py            Receivers of webhooks, each a process of its own, as the tests and
                           benchmarks start them
    workers.py             Runs that worker processes execute
"""
