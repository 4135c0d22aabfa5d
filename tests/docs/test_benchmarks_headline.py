"""docs/benchmarks.md leads with the headline of the checked-in bench/results/summary.json, and
that headline holds every fast-path figure beside its floor, its target and its growth; a summary
measured again makes the page stale (the docs' build fails the same way: docs/hooks/reference.py)."""

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.support.docs import DOCS, benchmarks_headline, generated_part, reference_renderer

pytestmark = pytest.mark.timeout(60)

HOOK = benchmarks_headline()
PART = "benchmarks-headline"


def _summary() -> dict[str, Any]:
    return json.loads(HOOK.SUMMARY.read_text())


def test_the_pages_first_table_is_the_headline_of_the_checked_in_summary() -> None:
    page = (DOCS / "benchmarks.md").read_text()
    assert generated_part("benchmarks.md", PART) == reference_renderer().render(PART), (
        "measure again with .venv/bin/python -m bench run_all --quick, or rewrite the page: "
        ".venv/bin/python docs/hooks/reference.py --write"
    )
    first_table = re.search(r"^\|", page, re.MULTILINE)
    assert first_table is not None
    assert page.index(f"<!-- generated: {PART} -->") < first_table.start() < page.index("## How to run them")


def test_the_headline_holds_each_fast_path_figure_with_its_floor_target_and_growth() -> None:
    headline = _summary()["headline"]
    rows = {row["figure"]: row for row in headline["rows"]}
    for wanted in (
        "`GET /healthz/` p50",
        "`GET /api/runs/{id}/` p50",
        "`GET /api/runs/{id}/` p99",
        "`POST /api/runs/` scheduled ahead p50",
        "`POST /api/runs/` scheduled ahead p99",
        "cancel of a running run, HTTP p50",
        "cancel of a running run, HTTP p99",
        "create → `run.started` at a watcher p50",
    ):
        assert any(name.startswith(wanted) for name in rows), wanted
    assert any(row["unit"] == "events/s" for row in rows.values())
    targeted = [row for row in rows.values() if row["target"]]
    assert len(targeted) >= 6 and all(isinstance(row["met"], bool) for row in targeted)
    assert all(row["x_floor"] for row in rows.values() if row["floor"])
    assert set(headline["growth_tiers"]) == {"x10", "x100"}
    for row in rows.values():
        assert set(row["tiers"]) == {"x10", "x100"}, row["figure"]
    assert headline["at"] and headline["machine"]


def test_a_figure_measured_again_leaves_the_page_stale(tmp_path: Path) -> None:
    summary = _summary()
    row = summary["headline"]["rows"][1]
    row["value"] = row["value"] * 2 + 1
    again = tmp_path / "summary.json"
    again.write_text(json.dumps(summary))

    rendered = HOOK.headline(again)
    assert rendered != generated_part("benchmarks.md", PART)
    assert f"| {row['figure']} |" in rendered
