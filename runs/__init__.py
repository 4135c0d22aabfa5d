"""The `runs` app: agent runs stored with their events, executed by worker processes, streamed and
commanded (docs/design/index.md); where each thing lives: docs/layout.md.
"""

# Modules (docs/hooks/reference.py --write keeps this index):
#
#     access.py         Who may see a run and who may do what to it, in the order of
#                       docs/design/api.md#check-order
#     admin/            The staff console, Django's admin
#     agents/           The public agent API: register an agent by name, with the event types of its
#                       own it emits
#     api/              The REST API: DRF views that validate their input, call one service or
#                       selector
#     apps.py           The app's start: its agents loaded, its system checks registered
#     asgi.py           The web process's start, for a project's `asgi.py`
#     conf.py           The settings registry: every `RUNLEDGER_*` setting of the app, declared once,
#                       with its kind, default
#     cursors.py        Values given in a query string, a header or a cursor
#     events.py         The event vocabulary: every event type the platform knows
#     exceptions.py     One error hierarchy for the whole project, mapped to the error shape in one
#                       place
#     health.py         Load-balancer probes: public, JSON, no session
#     http/             What every web entry of the app shares, owned by none of them
#     intervals.py      The lease timing an attempt derives from the interval settings, and the rule
#                       they must obey together
#     logs.py           Logs: the run, attempt and worker each line concerns
#     management/
#     metadata.py       A run's metadata: the caller's own labels — a JSON object of string keys and
#                       string values
#     metrics/          Prometheus metrics: `GET /metrics/`, the counts of every process, the state
#                       read at scrape time
#     migrations/
#     models/           The app's data and constraints, one module per noun
#     notify/           LISTEN/NOTIFY, for the services that send and the worker and streams that
#                       listen
#     pages.py          The end-user pages: the list of one's runs with a "start a demo run" form, and
#                       the watch page
#     private_paths.py  Directories of this process's user alone, on a machine other users share
#     recurrence.py     When a schedule is due: cron and interval due times in a time zone
#     selectors/        Every non-trivial read of runs and events, with the visibility rule
#     services/         Every write, one module per job, each service importable from here
#     setting_kinds.py  The kinds of setting the registry declares (runs/conf.py), and the registry's
#                       reading and checking
#     signals.py        The app's signals, for host code
#     signin.py         Signing in: the login page and the console's form
#     signin_urls.py    The sign-in pages, for a project to include where Django looks for them by
#                       default
#     storable.py       What a run may store as JSON
#     streaming/        A run's events as SSE, from the URL to the bytes
#     testing.py        Testing agents: a run executed in this process against the real database
#     transitions.py    The run state machine: one table, pure Python, no ORM
#     urls.py           The app's URLs, under the `runs` namespace, in three groups a host may include
#                       apart
#     worker/           Worker processes that execute runs (`manage.py runworker`)

# The one place the version is written: the distribution's metadata reads it (pyproject.toml).
__version__ = "0.1.0"
