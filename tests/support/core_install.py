"""A process that sees Python as an install of `runledger` without extras would: the extras'
packages cannot be imported (as on a machine where `pip install django-runledger` put none of them),
and every attempt to import one is noted with the module that made it.

    python -m tests.support.core_install [--set NAME=JSON]... [--call MODULE:FUNCTION] MODULE...

runs Django under tests/support/bare_host_settings.py (a host on SQLite; RUNLEDGER_TEST_HOST_DIR
names its folder), imports each MODULE, then calls FUNCTION if asked (after the --set settings
are applied), and prints one JSON object: `attempts` (each import of an extra: what, and by
which module), `loaded` (the extras' modules in sys.modules: none, unless one got in another way)
and `error` (the exception that stopped it, or null). Exits 0 whatever happened: the test judges.
"""

import argparse
import builtins
import importlib
import json
import os
import sys
import traceback
from typing import Any

# The optional dependencies' top-level modules: uvicorn (server), psycopg and its pool (postgres),
# pyzmq and PyJWT (edge), django-cors-headers (cors: a host's settings, never the app's import).
EXTRAS = ("uvicorn", "psycopg", "psycopg_pool", "zmq", "jwt", "corsheaders")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("modules", nargs="*")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=JSON")
    parser.add_argument("--call", metavar="MODULE:FUNCTION")
    args = parser.parse_args()

    for name in EXTRAS:
        # None in sys.modules is Python's own "not importable": import raises ModuleNotFoundError
        # and importlib.util.find_spec answers None, as when the package is not installed.
        sys.modules[name] = None
    attempts: list[dict[str, str | None]] = []
    real_import = builtins.__import__

    def noting_import(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if level == 0 and name.partition(".")[0] in EXTRAS:
            attempts.append({"module": name, "by": (globals or {}).get("__name__")})
        return real_import(name, globals, locals, fromlist, level)

    builtins.__import__ = noting_import
    error = None
    try:
        os.environ["DJANGO_SETTINGS_MODULE"] = "tests.support.bare_host_settings"
        import django

        django.setup()
        for module in args.modules:
            importlib.import_module(module)
        if args.call:
            from django.conf import settings

            for assignment in args.set:
                name, _, value = assignment.partition("=")
                setattr(settings, name, json.loads(value))
            module_name, _, function = args.call.partition(":")
            getattr(importlib.import_module(module_name), function)()
    except Exception as exc:
        error = {"type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()}
    finally:
        builtins.__import__ = real_import
    loaded = sorted(
        name for name, module in sys.modules.items() if module is not None and name.partition(".")[0] in EXTRAS
    )
    print(json.dumps({"attempts": attempts, "loaded": loaded, "error": error}))


if __name__ == "__main__":
    main()
