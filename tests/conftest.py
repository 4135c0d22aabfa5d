import os
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection

pytest_plugins = ["tests.procs"]

ON_SQLITE = os.environ.get("DATABASE_URL", "").startswith("sqlite")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # On SQLite only the tests that claim to hold there may run; bin/test selects them with
    # -m sqlite, and this guards a hand-run that forgot to.
    if ON_SQLITE:
        kept = [item for item in items if item.get_closest_marker("sqlite") is not None]
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept


@pytest.fixture(autouse=True, scope="session")
def _fast_password_hasher() -> None:
    from django.conf import settings

    # The default hasher costs half a second a user; tests need many users, not strong hashes.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def make_user(db: None) -> Callable[..., User]:
    counter = iter(range(1_000_000))

    def make(username: str | None = None, *, perms: tuple[str, ...] = (), is_staff: bool = False) -> User:
        user = User.objects.create_user(
            username=username or f"user{next(counter)}", password="pw-for-tests", is_staff=is_staff
        )
        for perm in perms:
            app_label, codename = perm.split(".")
            user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
        return User.objects.get(pk=user.pk)  # fresh, so the permission cache is empty

    return make


@pytest.fixture
def alice(make_user: Callable[..., User]) -> User:
    return make_user("alice")


@pytest.fixture
def bob(make_user: Callable[..., User]) -> User:
    return make_user("bob")


def race(n: int, target: Callable[[int], Any]) -> list[Any]:
    """Run `target(i)` in n real threads, each on its own database connection, released together.

    Returns each thread's result, or the exception it raised.
    """
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def body(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = target(i)
        except BaseException as exc:  # the caller inspects what each thread met
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
        assert not t.is_alive(), "a racing thread hung"
    return results
