"""The order bin/test's parallel workers take the tests in (a pytest plugin; conftest.py lists it).

pytest-xdist's --dist loadgroup hands out work in collection order: a module's process tests as
one unit (conftest.py groups them: its module-wide processes start once), every other test on its
own. Collected module by module, the last units handed out included whole process modules, and the
pass ended when the last of them did, the other workers idle. So the units go out longest first,
as far as their kind tells: the process modules, then the slow in-process tests (the admin's
sweeps, ten seconds each), then the rest — short tests that spread evenly over the workers' last
minutes. Each test still runs alone with its fixtures; only the order changes.
"""

import pytest


def _rank(item: pytest.Item) -> int:
    if item.get_closest_marker("xdist_group") is not None:
        return 0
    if item.get_closest_marker("slow") is not None:
        return 1
    return 2


@pytest.hookimpl(trylast=True)  # after pytest-django's own ordering, which would undo this one
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: a module's tests keep their order
