"""`manage.py create_token`: issue (or revoke) a user's API token, its key printed once
(docs/design/api.md#authentication)."""

import argparse
import contextlib
import re
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from runs.exceptions import NotFound, RunledgerError
from runs.models import ApiToken
from runs.services import MAX_LIFETIME, token_create, token_delete

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}
DEFAULT_NAME = "default"


def lifetime(text: str) -> timedelta:
    """`30d`, `12h`, `90m`, `3600s`, `2w`: a whole number and its unit."""
    found = re.fullmatch(r"([0-9]{1,9})([smhdw])", text.strip())
    if found is None:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number and a unit, s m h d or w (30d, 12h)")
    seconds = int(found.group(1)) * UNITS[found.group(2)]
    if not 0 < seconds <= MAX_LIFETIME.total_seconds():
        raise argparse.ArgumentTypeError(f"{text!r}: at least 1s and at most {MAX_LIFETIME.days}d (or none: never)")
    return timedelta(seconds=seconds)


class Command(BaseCommand):
    help = (
        "Issue an API token for a user and print its key once, as the last line of the output (on standard "
        "output alone: TOKEN=$(manage.py create_token alice)). Runledger keeps only the key's digest."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default=DEFAULT_NAME, help=f"the token's name (default: {DEFAULT_NAME})")
        parser.add_argument("--expires", type=lifetime, help="its lifetime, e.g. 30d, 12h, 90m (default: never)")
        parser.add_argument(
            "--replace", action="store_true", help="revoke the user's token of that name first, if there is one"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            user = get_user_model().objects.get_by_natural_key(options["username"])
        except get_user_model().DoesNotExist:
            raise CommandError(f"no user {options['username']!r}") from None
        name, expires = options["name"], options["expires"]
        if options["replace"]:
            with contextlib.suppress(NotFound):  # nothing to replace
                token_delete(user=user, name=name)
        elif ApiToken.objects.filter(user=user, name=name).exists():
            raise CommandError(f"{user} already holds a token named {name!r}: --replace revokes it first")
        try:
            token, key = token_create(
                user=user, name=name, expires_at=timezone.now() + expires if expires is not None else None
            )
        except RunledgerError as exc:
            raise CommandError(exc.message) from None
        until = f"until {token.expires_at.isoformat()}" if token.expires_at else "with no expiry"
        self.stderr.write(
            f"Issued the API token {token.name!r} of {user}, {until}; its key, on standard output, is shown only now.",
            style_func=lambda text: text,
        )
        self.stdout.write(key)
