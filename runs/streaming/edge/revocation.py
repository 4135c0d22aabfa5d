"""Revocations the edge's streams must not wait for (docs/design/edge.md#revocation): a user
deactivated or deleted, an API token of theirs deleted, or a session of theirs ended, each sending
`runledger_revoked` inside the transaction that revokes, so the leading publisher closes that
user's streams once it commits.
"""

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_out
from django.db.models.signals import post_delete, post_save

from runs import notify
from runs.http import token_cache
from runs.models import ApiToken


def _revoked(user_id: int | None) -> None:
    if user_id is not None:
        # The token caches hear it too (this process's own at the commit).
        token_cache.announce(notify.credential_revoked(user_id))


def _token_deleted(sender: Any, instance: ApiToken, **kwargs: Any) -> None:
    _revoked(instance.user_id)


def _user_saved(sender: Any, instance: Any, created: bool, **kwargs: Any) -> None:
    if not created and not instance.is_active:
        _revoked(instance.pk)


def _user_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    _revoked(instance.pk)


def _logged_out(sender: Any, user: Any, **kwargs: Any) -> None:
    # Sent before the session is flushed, in the same request; the clients' reconnects come a
    # `retry:` later, checked against the flushed session.
    _revoked(getattr(user, "pk", None))


def connect() -> None:
    """Hook the revocations (runs.apps, once)."""
    user = get_user_model()
    post_delete.connect(_token_deleted, sender=ApiToken, dispatch_uid="runledger-edge-token-deleted")
    post_save.connect(_user_saved, sender=user, dispatch_uid="runledger-edge-user-saved")
    post_delete.connect(_user_deleted, sender=user, dispatch_uid="runledger-edge-user-deleted")
    user_logged_out.connect(_logged_out, dispatch_uid="runledger-edge-logged-out")
