import re
from pathlib import Path

import pytest

from runs.transitions import ALLOWED, END_CODES, TERMINAL

pytestmark = pytest.mark.sqlite

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_state_diagram_is_the_transition_table() -> None:
    diagram = README.read_text().split("```mermaid", 1)[1].split("```", 1)[0]
    edges = set(re.findall(r"^\s*(\w+) --> (\w+)\s*$", diagram, re.MULTILINE))
    assert edges == {(a.value, b.value) for a, targets in ALLOWED.items() for b in targets}
    ends = set(re.findall(r"^\s*(\w+) --> \[\*\]\s*$", diagram, re.MULTILINE))
    assert ends == {s.value for s in TERMINAL}


def test_the_readme_end_codes_are_the_contracts() -> None:
    table = README.read_text().split("| status | end codes |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (.*) \|$", table, re.MULTILINE)
    # What a code means is said in parentheses, which may name settings too.
    documented = {
        status: set(re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", codes))) or {""} for status, codes in rows
    }
    assert documented == {status.value: set(codes) for status, codes in END_CODES.items()}


def test_the_readme_starts_with_the_two_commands() -> None:
    text = README.read_text()
    block = text.split("## Two commands", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["bin/run", "bin/test"]
    for command in commands:
        assert (README.parent / command).exists()
