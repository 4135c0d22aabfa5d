"""The run list's filters, each cheap whatever the size of the run table (docs/design/fair-use.md#admin-input)."""

from datetime import timedelta

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest
from django.utils import timezone

from runs.admin.display import format_duration
from runs.agents import registered_names
from runs.conf import conf
from runs.cursors import largest_of, plain_int
from runs.metadata import key_problem, value_problem
from runs.models import Run, RunAttempt
from runs.selectors import run_with_metadata
from runs.transitions import Status

# The owner filter lists this many owners at most; past that, search by username.
OWNERS_LISTED = 100


class AgentFilter(admin.SimpleListFilter):
    """The registered agents: no DISTINCT over the whole run table on every page."""

    title = "agent"
    parameter_name = "agent"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [(name, name) for name in sorted(registered_names())]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Run]) -> QuerySet[Run]:
        return queryset.filter(agent=self.value()) if self.value() else queryset


class OwnerFilter(admin.SimpleListFilter):
    """Users who own runs, found from the users' side (one probe of the owner index per user)
    rather than by a DISTINCT over every run, which grows with the table."""

    title = "owner"
    parameter_name = "owner"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        User = get_user_model()
        owners = (
            User.objects.filter(Exists(Run.objects.filter(owner_id=OuterRef("pk"))))
            .order_by(User.USERNAME_FIELD)
            .values_list("pk", User.USERNAME_FIELD)[:OWNERS_LISTED]
        )
        return [(str(pk), str(name)) for pk, name in owners]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Run]) -> QuerySet[Run]:
        value = self.value()
        if not value:
            return queryset
        owner = plain_int(value, most=largest_of(get_user_model()._meta.pk.get_internal_type()))
        return queryset.none() if owner is None else queryset.filter(owner_id=owner)


class HasParentFilter(admin.SimpleListFilter):
    title = "has parent"
    parameter_name = "has_parent"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("yes", "child runs"), ("no", "top-level runs")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Run]) -> QuerySet[Run]:
        if self.value() == "yes":
            return queryset.filter(parent__isnull=False)
        if self.value() == "no":
            return queryset.filter(parent__isnull=True)
        return queryset


class HeartbeatFilter(admin.SimpleListFilter):
    """Running runs whose worker has been silent for a whole lease: the sweeper should have
    requeued them, so finding any means no sweeper is running or it is falling behind."""

    title = "heartbeat"
    parameter_name = "heartbeat"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        lease = format_duration(timedelta(seconds=conf.LEASE_SECONDS))
        return [("stale", f"stale (running, silent > {lease})"), ("fresh", "fresh (running)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Run]) -> QuerySet[Run]:
        if self.value() not in ("stale", "fresh"):
            return queryset
        cutoff = timezone.now() - timedelta(seconds=conf.LEASE_SECONDS)
        silent = Exists(
            RunAttempt.objects.filter(run_id=OuterRef("pk"), generation=OuterRef("generation"), heartbeat_at__lt=cutoff)
        )
        running = queryset.filter(status=Status.RUNNING)
        return running.filter(silent) if self.value() == "stale" else running.exclude(silent)


class RunningForFilter(admin.SimpleListFilter):
    title = "running longer than"
    parameter_name = "running_for"
    periods = {
        "10m": ("10 minutes", timedelta(minutes=10)),
        "1h": ("1 hour", timedelta(hours=1)),
        "6h": ("6 hours", timedelta(hours=6)),
        "1d": ("1 day", timedelta(days=1)),
    }

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [(key, label) for key, (label, _) in self.periods.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Run]) -> QuerySet[Run]:
        choice = self.periods.get(self.value() or "")
        if choice is None:
            return queryset
        return queryset.filter(status=Status.RUNNING, started_at__lte=timezone.now() - choice[1])


def metadata_search(queryset: QuerySet[Run], term: str) -> QuerySet[Run]:
    """The runs labelled `key=value` (the list's search box; a username holds no "="): the
    metadata filter of the API. A label no run could carry matches none."""
    key, _, value = term.partition("=")
    key = key.strip()
    if key_problem(key) or value_problem(value.strip()):
        return queryset.none()
    return run_with_metadata(runs=queryset, metadata={key: value.strip()})
