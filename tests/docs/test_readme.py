from pathlib import Path

import pytest

pytestmark = pytest.mark.sqlite

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_starts_with_the_two_commands() -> None:
    text = README.read_text()
    block = text.split("## Two commands", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["bin/run", "bin/test"]
    for command in commands:
        assert (README.parent / command).exists()
