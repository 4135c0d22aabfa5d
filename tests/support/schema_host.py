"""A host project's process, with SPECTACULAR_SETTINGS and REST_FRAMEWORK of its own set in code
(CODE_SETTINGS, tests/support/code_settings.py) and the app under tests/support/host_urls.py's
prefix. It prints one JSON object: the app's schemas as THREADS threads asking at once, ROUNDS
times, got them (each distinct one once) and their statuses; then the host's own schema and
drf-spectacular's settings, as the project set them, after all that.

    python -m tests.support.schema_host THREADS ROUNDS
"""

import json
import sys
import threading
from typing import Any

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.test import Client  # noqa: E402
from drf_spectacular.settings import spectacular_settings  # noqa: E402

from tests.support.host_urls import PREFIX  # noqa: E402


def main(threads: int, rounds: int) -> None:
    schemas: set[str] = set()
    statuses: list[int] = []
    barrier = threading.Barrier(threads)

    def ask() -> None:
        client = Client(raise_request_exception=False)
        for _ in range(rounds):
            barrier.wait(timeout=60)
            response = client.get(f"/{PREFIX}api/schema/", {"format": "json"})
            statuses.append(response.status_code)
            schemas.add(json.dumps(json.loads(response.content), sort_keys=True))

    askers = [threading.Thread(target=ask) for _ in range(threads)]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join(timeout=120)
    hosts = Client().get("/api/schema/", {"format": "json"})
    after: dict[str, Any] = {name: getattr(spectacular_settings, name) for name in settings.SPECTACULAR_SETTINGS}
    print(
        json.dumps(
            {
                "app": [json.loads(schema) for schema in sorted(schemas)],
                "statuses": statuses,
                "hosts": {"status": hosts.status_code, "schema": json.loads(hosts.content)},
                "after": {name: value for name, value in after.items() if not callable(value)},
            },
            default=repr,
        )
    )


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
