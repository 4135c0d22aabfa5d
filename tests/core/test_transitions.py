import itertools

import pytest

from runs.exceptions import InvalidTransition
from runs.transitions import (
    ALLOWED,
    TERMINAL,
    CancelCode,
    Status,
    StopCode,
    can_transition,
    check_transition,
    descendant_end,
)

pytestmark = pytest.mark.sqlite

# docs/design/states.md#transitions, written out pair by pair so the table in transitions.py is
# checked, not restated.
EXPECTED = {
    ("queued", "running"),
    ("queued", "waiting"),
    ("queued", "cancelled"),
    ("queued", "stopped"),
    ("running", "waiting"),
    ("running", "completed"),
    ("running", "failed"),
    ("running", "cancelled"),
    ("running", "stopped"),
    ("running", "queued"),
    ("waiting", "queued"),
    ("waiting", "cancelled"),
    ("waiting", "stopped"),
}


@pytest.mark.parametrize("current,target", list(itertools.product(Status, Status)))
def test_every_pair_is_allowed_exactly_when_the_design_says(current: Status, target: Status) -> None:
    allowed = (current.value, target.value) in EXPECTED
    assert can_transition(current, target) is allowed
    if allowed:
        check_transition(current, target)
    else:
        with pytest.raises(InvalidTransition) as info:
            check_transition(current, target)
        assert (info.value.current, info.value.target) == (current, target)
        assert info.value.status_code == 409


def test_terminal_states_are_absorbing() -> None:
    assert {s.value for s in TERMINAL} == {"completed", "failed", "cancelled", "stopped"}
    for status in TERMINAL:
        assert ALLOWED[status] == frozenset()


@pytest.mark.parametrize(
    "parent,expected",
    [
        ("cancelled", ("cancelled", CancelCode.PARENT_CANCELLED)),
        ("stopped", ("stopped", StopCode.PARENT_STOPPED)),
        ("completed", ("cancelled", CancelCode.PARENT_ENDED)),
        ("failed", ("cancelled", CancelCode.PARENT_ENDED)),
    ],
)
def test_descendants_end_by_the_parents_outcome(parent: str, expected: tuple[str, str]) -> None:
    assert descendant_end(parent) == expected


@pytest.mark.parametrize("status", ["queued", "running", "waiting"])
def test_a_live_parent_ends_no_descendant(status: str) -> None:
    with pytest.raises(ValueError):
        descendant_end(status)
