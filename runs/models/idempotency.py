"""Idempotency records: the first answer to a retried create or bulk command
(docs/design/commands.md#idempotency); written by `runs.services.idempotency`."""

from django.conf import settings
from django.db import models

from runs.models.runs import Run


class IdempotencyRecord(models.Model):
    """The first successful response to a create carrying an `Idempotency-Key`, per user, for 24 h."""

    id = models.BigAutoField(primary_key=True)
    # No index of its own: the unique (user, key) leads with it (docs/design/deployment.md#indexes).
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", db_index=False)
    key = models.CharField(max_length=255)
    request_body = models.JSONField()
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = models.JSONField(null=True, blank=True)
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="idempotency_unique_user_key")]
        indexes = [models.Index(fields=["created_at"], name="idempotency_created")]

    def __str__(self) -> str:
        return f"{self.user_id}:{self.key}"
