"""API tokens (docs/design/api.md#authentication): each a user's named key, stored as the SHA-256
digest of the key — never the key — with an optional expiry. Data and constraints only; the writes
are runs.services.tokens, the look-up runs.selectors.credentials.
"""

import hashlib

from django.conf import settings
from django.db import models


def key_digest(key: str) -> str:
    """What the `digest` column holds for `key`: its SHA-256, in hex. Fast on purpose: keys are 256
    random bits, out of any guesser's reach with or without a slow hash (docs/design/api.md#authentication)."""
    return hashlib.sha256(key.encode()).hexdigest()


class ApiToken(models.Model):
    id = models.BigAutoField(primary_key=True)
    # No index of its own: the unique (user, name) leads with it (docs/design/deployment.md#indexes).
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens", db_index=False
    )
    # The user's handle for it (DELETE /api/tokens/{name}/): unique per user.
    name = models.CharField(max_length=64)
    digest = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField()
    # Null: never. Past it the token is refused as an unknown one, and its open streams end.
    expires_at = models.DateTimeField(null=True, blank=True)
    # Moved at most once a minute (runs.http.authentication), not on every request.
    last_used_at = models.DateTimeField(null=True, blank=True)
    # The token whose request issued this one: it expires no later, and is revoked with it.
    issued_by = models.ForeignKey("self", on_delete=models.CASCADE, null=True, blank=True, related_name="issued")

    class Meta:
        ordering = ["user", "created_at"]
        verbose_name = "API token"
        constraints = [
            # The look-up: a constraint, not unique=True, which on PostgreSQL adds a second
            # (LIKE) index no query here uses.
            models.UniqueConstraint(fields=["digest"], name="apitoken_digest"),
            models.UniqueConstraint(fields=["user", "name"], name="apitoken_user_name"),
        ]

    def __str__(self) -> str:
        return self.name
