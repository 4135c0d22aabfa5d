"""The design pages say what the code does: the state diagram and the end codes of
docs/design/states.md are the transition table of runs/transitions.py."""

import re
from pathlib import Path

import pytest

from runs.transitions import ALLOWED, END_CODES, TERMINAL

pytestmark = pytest.mark.sqlite

STATES = Path(__file__).resolve().parents[2] / "docs" / "design" / "states.md"


def test_the_state_diagram_is_the_transition_table() -> None:
    diagram = STATES.read_text().split("```mermaid", 1)[1].split("```", 1)[0]
    assert diagram.strip().startswith("stateDiagram-v2")
    edges = set(re.findall(r"^\s*(\w+) --> (\w+)\s*$", diagram, re.MULTILINE))
    assert edges == {(a.value, b.value) for a, targets in ALLOWED.items() for b in targets}
    ends = set(re.findall(r"^\s*(\w+) --> \[\*\]\s*$", diagram, re.MULTILINE))
    assert ends == {s.value for s in TERMINAL}


def test_the_end_codes_table_is_the_contracts() -> None:
    table = STATES.read_text().split("| status | end codes |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (.*) \|$", table, re.MULTILINE)
    # What a code means is said in parentheses, which may name settings too.
    documented = {
        status: set(re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", codes))) or {""} for status, codes in rows
    }
    assert documented == {status.value: set(codes) for status, codes in END_CODES.items()}
