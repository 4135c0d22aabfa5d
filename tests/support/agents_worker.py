"""TEMPORARY, until the RUNLEDGER_AGENTS setting lands (DESIGN §4): `manage.py runworker` does not
import the modules that environment variable names yet, so tests that need agents of their own
start the worker as `python -m tests.support.agents_worker runworker ...`, which imports them
first. Once the setting lands, delete this module and start such workers with
`procs.worker(worker_id, env=subprocess_env(RUNLEDGER_AGENTS=...))` (see workers.agents_worker).
"""

import importlib
import os
import sys

import django


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    for module in os.environ.get("RUNLEDGER_AGENTS", "").split(","):
        if module.strip():
            importlib.import_module(module.strip())
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", *sys.argv[1:]])


if __name__ == "__main__":
    main()
