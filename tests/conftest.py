import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User

pytest_plugins = [
    "tests.support.procs",
    "tests.support.browser",
    "tests.support.pg",
    "tests.support.live",
    "tests.support.schedule",
]

ON_SQLITE = os.environ.get("DATABASE_URL", "").startswith("sqlite")


# The fixtures that start real processes (web processes, workers, a browser, a PostgreSQL of its
# own): a test that asks for one is a `processes` test, which `bin/test --quick` leaves out.
PROCESS_FIXTURES = {"procs", "live", "proxy", "chromium", "browser_page", "pg_cluster"}


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a fixture that lives as long as its module or package: what the
    module's tests share, set up once where they run one after the other."""
    info = getattr(item, "_fixtureinfo", None)  # pytest's own record of the test's fixtures
    defs = info.name2fixturedefs.values() if info is not None else ()
    return any(d.scope in ("module", "package") for each in defs for d in each)


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.processes)
        # bin/test's workers (pytest-xdist --dist loadgroup) take a module's process tests together
        # where they share module-wide processes (a host's virtualenv, a server), which then start
        # once; every other test goes out alone, to whichever worker is free.
        process = any(item.get_closest_marker(name) for name in ("processes", "browser", "edge"))
        if process and _shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
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


@pytest.fixture(autouse=True, scope="session")
def _flush_retried_when_a_deadlocks_victim() -> Iterator[None]:
    """A transactional test ends with Django's flush: one TRUNCATE of every table, which locks them
    in the order of a Python set (so of the process's hash seed) while a module's live web process
    or worker may still be reading and writing the test's runs. When the two take tables in
    opposite orders PostgreSQL aborts one of them: mostly the live process's statement (it retries),
    but the flush whenever its wait closed the cycle, and then the next test found the last one's
    rows. The aborted flush has released its locks, so the other transaction ends and a second try
    goes through."""
    import psycopg
    from django.core.management.base import CommandError
    from django.core.management.commands import flush

    handle = flush.Command.handle

    def retried(self: flush.Command, *args: Any, **options: Any) -> None:
        for attempt in range(5):
            try:
                return handle(self, *args, **options)
            except CommandError as error:
                cause = getattr(error.__cause__, "__cause__", None)
                if attempt == 4 or not isinstance(cause, psycopg.errors.DeadlockDetected):
                    raise

    flush.Command.handle = retried  # type: ignore[method-assign]
    yield
    flush.Command.handle = handle  # type: ignore[method-assign]


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


@pytest.fixture
def agent_named() -> Iterator[Callable[..., str]]:
    """Register agents for one test only: `agent_named(name, agent, event_types=[...])`."""
    from runs.agents import base

    names: list[str] = []

    def register(name: str, agent: Any, event_types: Sequence[str] = ()) -> str:
        base.register(name, event_types=event_types)(agent)
        names.append(name)
        return name

    yield register
    for name in names:
        base._REGISTRY.pop(name, None)
