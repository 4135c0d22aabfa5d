from io import StringIO

import pytest
from django.core.management import call_command

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def test_migrations_match_the_models() -> None:
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)
