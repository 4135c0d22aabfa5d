"""A run: what it runs, its budgets, its state and how it ended (docs/design/states.md). Data and
constraints only: every write goes through `runs.services`; the constraints are the last line of
defence for what must never be stored, whatever code path tried."""

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from runs.conf import conf
from runs.transitions import LIVE, TERMINAL, CancelCode, FailCode, Status, StopCode


def _default_max_attempts() -> int:
    return conf.DEFAULT_MAX_ATTEMPTS


# Sorted plain strings, so the generated migration is stable.
_TERMINAL = sorted(s.value for s in TERMINAL)
# Stated positively in the index below and in the queries it serves: PostgreSQL proves that
# `status IN (...)` (or `status = 'running'`) falls in the index, never that `NOT IN` does.
LIVE_VALUES = sorted(s.value for s in LIVE)
# Likewise the ended runs' index `run_owner_ended` (runs.services.quotas).
TERMINAL_VALUES = _TERMINAL

# A run's `priority` (docs/design/fair-use.md#priority): anyone may order their own runs within
# -100..100; above it, up to URGENT_MAX, only holders of `runs.prioritize_run`, and such a run is
# claimed before any fair-share pick.
PRIORITY_MIN, PRIORITY_MAX, URGENT_MAX = -100, 100, 1000


class Run(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: `run_owner_created` leads with it (docs/design/deployment.md#indexes).
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="runs", db_index=False)
    agent = models.CharField(max_length=64)
    input = models.JSONField(default=dict)
    # The caller's labels, string to string (runs.metadata), copied to the run's children. Never
    # changed after the insert, so its GIN index on PostgreSQL (migration 0010, `metadata @> …`
    # lookups) costs the run's frequent updates nothing: they stay HOT.
    metadata = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=[(s.value, s.value) for s in Status], default=Status.QUEUED.value)
    end_code = models.CharField(max_length=32, blank=True, default="")
    end_reason = models.TextField(blank=True, default="")
    ended_by = models.CharField(max_length=150, blank=True, default="")
    output = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    # This and `rerun_of` are indexed where set only (`run_parent`, `run_rerun_of`): most runs have
    # neither, and an index of their nulls was written with every run (deployment.md#indexes).
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children", db_index=False
    )
    # The run this one runs again (docs/design/commands.md#rerun). SET_NULL: purging the original
    # leaves its reruns, which have lives (and owners) of their own.
    rerun_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="reruns", db_index=False
    )
    last_seq = models.BigIntegerField(default=0)
    # Generation of the current (or last) attempt; appends must name it.
    generation = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=_default_max_attempts)
    lost_attempts = models.PositiveIntegerField(default=0)
    resume_ticket = models.CharField(max_length=64, blank=True, default="")
    pause_requested_at = models.DateTimeField(null=True, blank=True)
    max_steps = models.PositiveIntegerField(null=True, blank=True)
    max_events = models.PositiveIntegerField(null=True, blank=True)
    # Budget usage, counted across attempts.
    steps_used = models.PositiveIntegerField(default=0)
    events_used = models.PositiveIntegerField(default=0)
    # What the agent reported it used (`usage.reported`, and a stopped attempt's last report), its
    # counters summed: counted in the append's own update of the run (docs/design/events.md#usage).
    reported_usage = models.JSONField(default=dict, blank=True)
    # The events stored that the agent's partial-output rule reads (output.delta by default): set
    # in the append's update of the run, so that the end of a run says whether it has a partial
    # output from the locked row alone (docs/design/execution.md#partial-output).
    partial_events = models.PositiveIntegerField(default=0)
    # Bytes of JSON (compact UTF-8, `runs.storable.json_bytes`) of its input, output and error: a list
    # leaves out a big one without reading it (docs/design/fair-use.md#bounded-answers,
    # runs.selectors.run_list_values).
    input_bytes = models.PositiveIntegerField(default=0)
    output_bytes = models.PositiveIntegerField(default=0)
    error_bytes = models.PositiveIntegerField(default=0)
    # Everything the run stores, in those bytes: input, each event's data, output and error. Saved
    # with the writes that append (no statement of its own), and in no index, so that an append's
    # update of the run stays a HOT update (PostgreSQL updates in place only rows whose indexed
    # columns are unchanged).
    stored_bytes = models.PositiveBigIntegerField(default=0)
    # `stored_bytes` once the run has ended (0 before), which nothing changes again: indexed by owner
    # (`run_owner_ended`), so a create sums an owner's ended runs from the index alone, and only
    # their live runs from the table (runs.services.quotas).
    ended_bytes = models.PositiveBigIntegerField(default=0)
    # The tool calls started and not finished, as [call_id, name] pairs in the order they started:
    # the run's end seals them (docs/design/events.md#tool-seal) without reading its events back.
    open_tool_calls = models.JSONField(default=list, blank=True)
    deadline = models.DateTimeField(null=True, blank=True)
    # Orders the owner's own queued runs, higher first; above PRIORITY_MAX it jumps fair share.
    priority = models.SmallIntegerField(default=0)
    # Not claimed before this time (docs/design/fair-use.md#start-after).
    start_after = models.DateTimeField(null=True, blank=True)
    # The owner's place in the line between owners: when the run became due (created, or its
    # start_after). A claim that takes a higher-priority run swaps it with the owner's earliest
    # one, so a priority reorders an owner's runs and never moves them ahead of another owner
    # (runs.services.quotas). Null for runs that ended before it existed.
    turn_at = models.DateTimeField(null=True, blank=True)
    # The schedule that created it and the due time it fired for (docs/design/schedules.md): one
    # run per due time, held by the constraint below whatever fires it.
    # No index of its own: the constraint's serves every look-up by schedule, and a create pays for none.
    schedule = models.ForeignKey(
        "runs.Schedule", null=True, blank=True, on_delete=models.SET_NULL, related_name="runs", db_index=False
    )
    schedule_due_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    # When the run last entered the queue (create, requeue, resume): what the queue's age counts from.
    queued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at"]
        permissions = [
            ("cancel_run", "Can cancel any visible run"),
            ("stop_run", "Can stop runs"),
            ("prioritize_run", "Can give runs a priority above 100, claimed before fair share"),
        ]
        indexes = [
            models.Index(fields=["status", "created_at"], name="run_status_created"),
            models.Index(fields=["owner", "-created_at"], name="run_owner_created"),
            models.Index(fields=["agent", "-created_at"], name="run_agent_created"),
            models.Index(fields=["-created_at"], name="run_created"),
            models.Index(fields=["parent"], name="run_parent", condition=Q(parent__isnull=False)),
            models.Index(fields=["rerun_of"], name="run_rerun_of", condition=Q(rerun_of__isnull=False)),
            # The claim (runs.services.ranking, quotas), over the queued rows only: each owner's earliest turn ...
            models.Index(fields=["owner", "turn_at"], name="run_queued_turn", condition=Q(status="queued")),
            # ... the run the owner puts forward: highest priority, then oldest ...
            models.Index(
                fields=["owner", "-priority", "created_at", "id"], name="run_queued_pick", condition=Q(status="queued")
            ),
            # ... the runs that jump fair share (few, or none) ...
            models.Index(
                fields=["-priority", "created_at", "id"],
                name="run_queued_urgent",
                condition=Q(status="queued", priority__gt=PRIORITY_MAX),
            ),
            # ... and a worker's next wake-up: the soonest start_after still ahead.
            models.Index(
                fields=["start_after"], name="run_queued_start", condition=Q(status="queued", start_after__isnull=False)
            ),
            # The queue's age: the queued run that entered it first (selectors.overview).
            models.Index(fields=["queued_at"], name="run_queued_at", condition=Q(status="queued")),
            # The dashboard's runs ended per minute and by status over the last day (selectors.overview).
            models.Index(fields=["ended_at"], name="run_ended", condition=Q(ended_at__isnull=False)),
            # Per-owner counts of live runs: the active-runs cap at create, the running cap and fair
            # share at claim (docs/design/fair-use.md#fair-claiming).
            models.Index(fields=["owner", "status"], name="run_owner_live", condition=Q(status__in=LIVE_VALUES)),
            # The runs an owner keeps and the bytes their ended ones store: the caps at create.
            models.Index(
                fields=["owner", "ended_bytes"], name="run_owner_ended", condition=Q(status__in=TERMINAL_VALUES)
            ),
            # The sweeper's deadline query: live runs that have a deadline, soonest first.
            models.Index(
                fields=["deadline"],
                name="run_live_deadline",
                condition=Q(deadline__isnull=False) & ~Q(status__in=_TERMINAL),
            ),
        ]
        constraints = [
            models.CheckConstraint(
                name="run_terminal_has_ended_at",
                condition=Q(status__in=_TERMINAL, ended_at__isnull=False)
                | (~Q(status__in=_TERMINAL) & Q(ended_at__isnull=True)),
            ),
            models.CheckConstraint(
                name="run_end_code_matches_status",
                condition=Q(status=Status.COMPLETED.value, end_code="")
                | Q(status=Status.FAILED.value, end_code__in=sorted(c.value for c in FailCode))
                | Q(status=Status.CANCELLED.value, end_code__in=sorted(c.value for c in CancelCode))
                | Q(status=Status.STOPPED.value, end_code__in=sorted(c.value for c in StopCode))
                | (~Q(status__in=_TERMINAL) & Q(end_code="")),
            ),
            models.CheckConstraint(
                name="run_stopped_has_reason", condition=~Q(status=Status.STOPPED.value) | ~Q(end_reason="")
            ),
            models.CheckConstraint(
                name="run_ticket_only_when_waiting",
                condition=Q(status=Status.WAITING.value) | Q(resume_ticket=""),
            ),
            models.UniqueConstraint(
                fields=["schedule", "schedule_due_at"],
                name="run_one_per_due_time",
                condition=Q(schedule__isnull=False),
            ),
            models.CheckConstraint(name="run_last_seq_nonnegative", condition=Q(last_seq__gte=0)),
            models.CheckConstraint(
                name="run_priority_bounded", condition=Q(priority__gte=PRIORITY_MIN, priority__lte=URGENT_MAX)
            ),
        ]

    def __str__(self) -> str:
        return f"{self.agent} run {self.id} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL


class Dashboard(Run):
    """The staff dashboard's entry in the admin (runs.admin.dashboard): no table and no rows of its
    own; it gives the page its URL beside the app's, `/admin/runs/dashboard/`, and its line on
    the admin index, with the admin site's own URLs, in any project."""

    class Meta:
        proxy = True
        verbose_name = verbose_name_plural = "dashboard"
        default_permissions = ()
