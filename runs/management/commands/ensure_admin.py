"""`manage.py ensure_admin`: a first local superuser on an empty database, as `bin/run` makes (docs/tutorial.md)."""

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "On a database with no users, create a local `admin` superuser and print its password once."

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        if User.objects.exists():
            return
        password = secrets.token_urlsafe(12)
        User.objects.create_superuser(username="admin", email="", password=password)
        self.stdout.write(
            self.style.SUCCESS(f"Created the local admin account: username 'admin', password '{password}'")
        )
        self.stdout.write("This password is shown only once; change it in the admin.")
