"""Failed sign-ins and token authentications, counted (docs/design/fair-use.md#sign-in-throttle)."""

from django.db import models


class AuthFailure(models.Model):
    """A failed sign-in or token authentication, once under each key it counts against (a client
    address, a username), for RUNLEDGER_AUTH_FAILURE_WINDOW_SECONDS
    (docs/design/fair-use.md#sign-in-throttle; runs.http.throttles).

    In the database, not in a process, so that every web process counts against one limit.
    """

    id = models.BigAutoField(primary_key=True)
    # SHA-256 (hex) of what is counted: a username field may hold a mistyped password, and this
    # table should hold no secret, even for a few minutes.
    key = models.CharField(max_length=64)
    failed_at = models.DateTimeField()

    class Meta:
        indexes = [
            # The check: one key's newest failures within the window.
            models.Index(fields=["key", "failed_at"], name="authfailure_key_at"),
            # The clean-up: every failure past the window.
            models.Index(fields=["failed_at"], name="authfailure_at"),
        ]

    def __str__(self) -> str:
        return f"{self.key[:12]}… {self.failed_at.isoformat()}"
