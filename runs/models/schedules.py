"""Schedules (docs/design/schedules.md): recurring runs, each due time fired exactly once. Data and
constraints only; the writes are runs.services.schedules, the firing the workers' scheduler."""

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from runs.models.runs import PRIORITY_MIN, URGENT_MAX


class Overlap(models.TextChoices):
    """What a due time does while the schedule's last run is live (Temporal's names)."""

    SKIP = "skip"
    BUFFER_ONE = "buffer_one"
    ALLOW_ALL = "allow_all"
    CANCEL_OTHER = "cancel_other"


class Schedule(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: `schedule_owner_created` leads with it (docs/design/deployment.md#indexes).
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="schedules", db_index=False
    )
    # What each run it creates runs: as a run's create would take them.
    agent = models.CharField(max_length=64)
    input = models.JSONField(default=dict)
    metadata = models.JSONField(default=dict, blank=True)
    priority = models.SmallIntegerField(default=0)
    # Exactly one of the two: a cron expression (five fields or a macro) read in `timezone`, or a
    # fixed interval whose due times are `anchor + k * every_seconds`.
    cron = models.CharField(max_length=128, blank=True, default="")
    every_seconds = models.PositiveIntegerField(null=True, blank=True)
    timezone = models.CharField(max_length=64, default="UTC")
    overlap = models.CharField(max_length=16, choices=Overlap.choices, default=Overlap.SKIP)
    catchup_window_seconds = models.PositiveIntegerField(default=0)
    start_at = models.DateTimeField(null=True, blank=True)
    end_at = models.DateTimeField(null=True, blank=True)
    # Where an interval counts from: `start_at`, or the creation time.
    anchor = models.DateTimeField()
    paused = models.BooleanField(default=False)
    # The next due time not yet fired; null once past `end_at`. Moved in the transaction that fires.
    next_due_at = models.DateTimeField(null=True, blank=True)
    # The last run it created (the overlap policy's "live one", and the admin's last status).
    last_run = models.ForeignKey("runs.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # `buffer_one`: the due time waiting for the live run to end (at most one).
    buffered_due_at = models.DateTimeField(null=True, blank=True)
    # What it last told webhooks, until a run is created: a streak of skips or failures is told
    # once, so its notifications are bounded by its runs (docs/design/schedules.md#webhooks).
    told = models.CharField(max_length=32, blank=True, default="")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at"]
        # Staff allowed schedules more often than RUNLEDGER_MIN_SCHEDULE_SECONDS (docs/design/schedules.md#limits).
        permissions = [("schedule_often", "Can schedule runs more often than the minimum interval")]
        indexes = [
            # The scheduler's pick: active schedules by their next due time.
            models.Index(
                fields=["next_due_at"], name="schedule_due", condition=Q(paused=False, next_due_at__isnull=False)
            ),
            models.Index(fields=["owner", "-created_at"], name="schedule_owner_created"),
            # The scheduler's look for `buffer_one` due times whose live run may have ended: the few
            # schedules holding one.
            models.Index(
                fields=["buffered_due_at"], name="schedule_buffered", condition=Q(buffered_due_at__isnull=False)
            ),
        ]
        constraints = [
            models.CheckConstraint(
                name="schedule_cron_or_interval",
                condition=(~Q(cron="") & Q(every_seconds__isnull=True)) | (Q(cron="") & Q(every_seconds__gt=0)),
            ),
            models.CheckConstraint(
                name="schedule_priority_bounded", condition=Q(priority__gte=PRIORITY_MIN, priority__lte=URGENT_MAX)
            ),
        ]

    def __str__(self) -> str:
        every = self.cron or f"every {self.every_seconds} s"
        return f"{self.agent} schedule {self.id} ({every})"
