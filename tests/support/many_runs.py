"""Many runs at once, for the tests (and benchmarks) that need a crowd: made through the create
service, one at a time, as a client's creates would make them — never as rows written by hand."""

from collections.abc import Mapping
from typing import Any

from django.contrib.auth.models import User
from django.test import override_settings

from runs import services
from runs.models import Run

# A crowd is more than a user may hold by default (RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER): the caps
# are lifted while it is made (0: none).
NO_CAPS = {
    "RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER": 0,
    "RUNLEDGER_MAX_RUNS_PER_USER": 0,
    "RUNLEDGER_MAX_STORED_BYTES_PER_USER": 0,
}


def create_runs(
    owner: User, count: int, *, metadata: Mapping[str, str] | None = None, input: dict[str, Any] | None = None
) -> list[Run]:
    """`count` queued demo runs of `owner`, each with `metadata` and `input`."""
    with override_settings(**NO_CAPS):
        return [
            services.run_create(
                owner=owner, agent="demo", input=dict(input or {"deltas": 3}), metadata=dict(metadata or {})
            )
            for _ in range(count)
        ]
