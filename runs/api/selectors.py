"""Reads the API composes from `runs.selectors` (visibility stays there).

They could move into `runs/selectors/`; they live here because only the API uses them so far.
"""

from django.db.models import F, Prefetch, QuerySet

from runs.models import Run, RunAttempt


def run_with_current_attempt(*, runs: QuerySet[Run]) -> QuerySet[Run]:
    """Prefetch each run's current attempt into `current_attempts` (0 or 1 item): one query for
    a whole page instead of one per run."""
    current = RunAttempt.objects.filter(generation=F("run__generation"))
    return runs.prefetch_related(Prefetch("attempts", queryset=current, to_attr="current_attempts"))
