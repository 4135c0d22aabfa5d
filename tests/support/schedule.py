"""The order bin/test's parallel workers take the tests in (a pytest plugin; conftest.py lists it).

pytest-xdist's --dist loadgroup hands out work in collection order: the process tests of a module
that shares processes module-wide as one unit (conftest.py groups them: those start once), every
other test on its own. Collected module by module, the last units handed out included whole
process modules, and the pass ended when the last of them did, the other workers idle. So the units
go out longest first, as far as their kind tells: the process tests (grouped or not), then the
slow in-process tests (the admin's sweeps, ten seconds each), then the rest — short tests that
spread evenly over the workers' last minutes. Each test still runs alone with its fixtures; only
the order changes.
"""

import pytest


def _group_in_nodeid(item: pytest.Item) -> None:
    """What pytest-xdist's worker does for --dist loadgroup, done here when it had no effect: the
    scheduler reads a unit's group from the `@group` ending of each test's id, which xdist 3.8 writes
    into `item._nodeid` — a field pytest 9.2 no longer reads its ids from (its structured `_id`), so
    every test went out alone and a module's processes started once per worker that took one of
    its tests, interleaved (https://github.com/pytest-dev/pytest-xdist/issues/1386). Once xdist writes
    the id itself again, this does nothing."""
    names = sorted(
        {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    )
    if not names or "@" in item.nodeid.rsplit("]", 1)[-1]:
        return
    from _pytest.nodeid import NodeId

    item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(names)}")  # type: ignore[attr-defined]


def _rank(item: pytest.Item) -> int:
    if any(item.get_closest_marker(name) for name in ("xdist_group", "processes", "browser", "edge")):
        return 0
    if item.get_closest_marker("slow") is not None:
        return 1
    return 2


@pytest.hookimpl(trylast=True)  # after pytest-django's own ordering, which would undo this one
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if getattr(config.option, "loadgroup", False):  # an xdist worker under --dist loadgroup
        for item in items:
            _group_in_nodeid(item)
    items.sort(key=_rank)  # stable: a module's tests keep their order
