"""A run's events, ordered by a gap-free `seq` (docs/design/events.md#event-object): data and
constraints only; appended by `runs.services.core.append`."""

from django.db import models
from django.db.models import Q

from runs.models.runs import Run


class RunEvent(models.Model):
    id = models.BigAutoField(primary_key=True)
    # No index of its own: the unique (run, seq) leads with it (docs/design/deployment.md#indexes).
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events", db_index=False)
    seq = models.BigIntegerField()
    type = models.CharField(max_length=64)
    data = models.JSONField(default=dict)
    # Generation of the attempt that wrote it; null for commands and the sweeper.
    attempt = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField()
    # Bytes of JSON of `data` (`runs.storable.json_bytes`), so a page is cut at its byte bound without
    # reading the events past it (runs.selectors.wire). Null for events stored
    # before it existed: their size is then measured when read. Not a PositiveIntegerField: its
    # CHECK would make adding the column scan the whole events table under an exclusive lock.
    data_bytes = models.IntegerField(null=True, blank=True)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [
            models.CheckConstraint(name="runevent_seq_positive", condition=Q(seq__gte=1)),
            # Gap-free seq is allocated under the run's lock; this is the net under it.
            models.UniqueConstraint(fields=["run", "seq"], name="runevent_unique_run_seq"),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.type}"

    def as_dict(self) -> dict[str, object]:
        """The event object (docs/design/events.md#event-object): the same in JSON pages and in SSE
        `data:`."""
        return {
            "seq": self.seq,
            "type": self.type,
            "data": self.data,
            "created_at": self.created_at.isoformat().replace("+00:00", "Z"),
            "attempt": self.attempt,
        }
