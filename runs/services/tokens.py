"""API tokens issued and revoked (docs/design/api.md#tokens): by the API for the caller, by
`manage.py create_token` and by the admin. A key exists only in the answer that issues it; the
database keeps its digest (runs.models.tokens).

Bad input is a ValidationFailed naming the field, before anything is written.
"""

import re
import secrets
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from runs.access import User
from runs.conf import conf
from runs.exceptions import NotFound, PermissionDenied, TooManyRequests, ValidationFailed
from runs.models import ApiToken, key_digest

# A name is a URL path segment (DELETE /api/tokens/{name}/): plain characters, never "." or "..".
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
NAME_RULE = "1 to 64 of A-Z a-z 0-9 . _ -, starting with a letter or digit"
# For longer, no expiry at all: an explicit one this far out is more likely a mistake (and ten
# thousand years cannot be stored).
MAX_LIFETIME = timedelta(days=3650)
# Keys say what they are to secret scanners; 32 random bytes after it.
KEY_PREFIX = "rl_"


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def _refuse(field: str, problem: str) -> ValidationFailed:
    return ValidationFailed(f"{field}: {problem}", detail={field: [problem]})


def _checked_expiry(expires_at: datetime | None, issued_by: ApiToken | None, now: datetime) -> datetime | None:
    if expires_at is not None and not now < expires_at <= now + MAX_LIFETIME:
        raise _refuse("expires_at", "must be in the future, at most 3650 days ahead (for longer, give none)")
    if issued_by is None or issued_by.expires_at is None:
        return expires_at
    # Issued with a token: never outliving it, so that a leaked token cannot make itself a longer life.
    if expires_at is None:
        return issued_by.expires_at
    if expires_at > issued_by.expires_at:
        raise _refuse(
            "expires_at",
            f"a token may issue tokens that expire no later than itself ({issued_by.expires_at.isoformat()})",
        )
    return expires_at


def _lock_user(user_id: int) -> None:
    # The user's token creates and deletes one at a time, so the cap and the names are counted
    # with every earlier one committed. NO KEY: inserting a token only takes a key-share lock on
    # the user, which this does not block.
    list(get_user_model().objects.select_for_update(no_key=True).filter(pk=user_id).values_list("pk"))


def token_create(
    *, user: User, name: str, expires_at: datetime | None = None, issued_by: ApiToken | None = None
) -> tuple[ApiToken, str]:
    """A new token of `user` and its key, which nothing stores: shown once, by the caller.

    `issued_by` is the token the request came with, if any: the new one expires no later, and is
    revoked with it. At RUNLEDGER_MAX_TOKENS_PER_USER tokens (expired ones count until deleted) a
    429."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise _refuse("name", f"must be {NAME_RULE}")
    now = timezone.now()
    expires_at = _checked_expiry(expires_at, issued_by, now)
    key = new_key()
    with transaction.atomic():
        _lock_user(user.pk)
        if issued_by is not None and not ApiToken.objects.filter(pk=issued_by.pk).exists():
            raise PermissionDenied("the token this request came with has just been revoked")
        held = ApiToken.objects.filter(user_id=user.pk)
        cap = conf.MAX_TOKENS_PER_USER
        if cap is not None and (count := held.count()) >= cap:
            raise TooManyRequests(
                f"you hold {count} API tokens, the most allowed (RUNLEDGER_MAX_TOKENS_PER_USER); "
                "delete one (expired ones count until deleted)",
                retry_after=conf.LIMIT_RETRY_AFTER_SECONDS,
                detail={"tokens": count, "limit": cap},
            )
        if held.filter(name=name).exists():
            raise _refuse("name", f"you already hold a token named {name}")
        token = ApiToken.objects.create(
            user_id=user.pk,
            name=name,
            digest=key_digest(key),
            created_at=now,
            expires_at=expires_at,
            issued_by=issued_by,
        )
    return token, key


def token_delete(*, user: User, name: str) -> None:
    """Revoke the user's token `name` at once, with the tokens it issued (their open streams end:
    runs.streaming.edge.revocation, and the streams' re-check)."""
    if not NAME.fullmatch(name):
        raise NotFound("you hold no token of that name")  # and no database is asked about a NUL
    with transaction.atomic():
        _lock_user(user.pk)
        token = ApiToken.objects.filter(user_id=user.pk, name=name).first()
        if token is None:
            raise NotFound(f"you hold no token named {name}")
        token.delete()
