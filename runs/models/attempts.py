"""A run's execution attempts, one per claim (docs/design/execution.md): data and constraints only;
written by `runs.services.execution` and the sweeper."""

from django.db import models
from django.db.models import Q

from runs.models.runs import Run


class AttemptOutcome(models.TextChoices):
    RUNNING = "", "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STOPPED = "stopped"
    WAITING = "waiting"
    SHUTDOWN = "shutdown"
    LOST = "lost"
    ABANDONED = "abandoned"


class RunAttempt(models.Model):
    id = models.BigAutoField(primary_key=True)
    # No index of its own: the unique (run, generation) leads with it (docs/design/deployment.md#indexes).
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="attempts", db_index=False)
    generation = models.PositiveIntegerField()
    worker = models.CharField(max_length=200)
    claimed_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    lease_expires_at = models.DateTimeField()
    # When the worker stopped executing it. The outcome is set when the run leaves this attempt's
    # hands (terminal, waiting, requeued), which for a cancel is before the worker has stopped.
    released_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=AttemptOutcome.choices, blank=True, default="")
    # Where the worker runs — the machine's boot and its PID namespace — and the process groups the
    # attempt's tools run in, as [pgid, start time in clock ticks since boot] pairs: a worker or
    # sweeper in the same place kills what is left of them once the attempt is lost
    # (runs.worker.steps).
    machine = models.CharField(max_length=100, blank=True, default="")
    process_groups = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["run", "generation"]
        constraints = [
            models.UniqueConstraint(fields=["run", "generation"], name="runattempt_unique_generation"),
            models.CheckConstraint(name="runattempt_generation_positive", condition=Q(generation__gte=1)),
            # An attempt whose outcome is still open is the run's current one; there is at most one.
            models.UniqueConstraint(fields=["run"], condition=Q(outcome=""), name="runattempt_one_open_per_run"),
        ]
        indexes = [
            models.Index(fields=["lease_expires_at"], name="runattempt_open_lease", condition=Q(outcome="")),
            # The sweeper's other search: attempts left by their run and never released.
            models.Index(
                fields=["lease_expires_at"], name="runattempt_unreleased", condition=Q(released_at__isnull=True)
            ),
            # The dashboard's cancel -> released latencies of the last day (selectors.overview):
            # `lost` too, which a cancelled attempt becomes when a sweeper releases it.
            models.Index(
                fields=["released_at"],
                name="runattempt_cancel_released",
                condition=Q(outcome__in=["cancelled", "lost", "stopped"], released_at__isnull=False),
            ),
            # A worker starting on a machine: the lost attempts there whose tool processes may be left
            # (runs.worker.orphans). Tiny: groups are forgotten once they have been dealt with.
            models.Index(
                fields=["machine"],
                name="runattempt_lost_groups",
                condition=Q(outcome="lost") & ~Q(process_groups=[]),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} attempt {self.generation}"
