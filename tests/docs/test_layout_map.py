"""The maps of the code cannot drift (docs/layout.md): its module listings and the package indexes
are what the code renders and name every module, every path the code and the manual name exists,
module docstrings stay short, no file cites an issue by its number, and the changelog stays terse.
Each check is also shown failing on a made-up tree or text."""

import ast
import io
import os
import re
import shutil
import subprocess
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.docs import code_maps, generated_part, reference_renderer
from tests.support.procs import ROOT

# docs/hooks/maps.py, loaded once: what the docs' build and `reference.py --write` run.
MAPS = code_maps()
LAYOUT_PARTS = ("layout-runs", "layout-tests", "layout-bench", "layout-clients")
# A module says what it is for in a few lines and links its design page; a longer text is an essay
# the design page should hold. The generated index of a package's modules is a map, not counted.
DOCSTRING_LINES = 12
SHORT_DOCSTRINGS = ("runs", "bench", "tests/support")
# Keep a Changelog's kinds of change, and what one entry may take.
CHANGE_KINDS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
ENTRY_LINES = 3


def _layout() -> str:
    return (ROOT / "docs" / "layout.md").read_text()


# --- the maps ---------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_the_layout_listings_and_the_package_indexes_are_what_the_code_renders() -> None:
    renderer = reference_renderer()
    stale = [name for name in LAYOUT_PARTS if generated_part("layout.md", name) != renderer.render(name)]
    stale += MAPS.stale_indexes()
    assert stale == [], "rewrite them: .venv/bin/python docs/hooks/reference.py --write"


@pytest.mark.timeout(30)
def test_the_layout_names_every_module_by_its_path() -> None:
    assert MAPS.unlisted(_layout()) == []


def _indexed_names(init: Path) -> set[str]:
    """The names a package's index lists (the first word of each of its entries)."""

    block = MAPS.index_block(init.read_text())
    assert block, f"{init}: it has no index"
    lines = [line[2:] for line in block.splitlines()[1:]]
    return {line.split()[0] for line in lines if line.startswith("    ") and not line.startswith("     ")}


@pytest.mark.timeout(30)
def test_each_package_index_names_each_module_of_its_package() -> None:
    wrong = {}
    for package in MAPS.indexed_packages():
        there = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
        there |= {f"{p.parent.name}/" for p in package.glob("*/__init__.py") if "__pycache__" not in p.parts}
        listed = _indexed_names(package / "__init__.py")
        if listed != there:
            wrong[str(package.relative_to(ROOT))] = {"missing": sorted(there - listed), "gone": sorted(listed - there)}
    assert wrong == {}


def _copy_tree(to: Path) -> None:
    """The checkout's Python modules of the mapped folders, and docs/layout.md, under `to`."""
    for top in ("runs", "tests", "bench", "clients/python"):
        for path in MAPS.modules(ROOT / top):
            target = to / path.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    (to / "docs").mkdir()
    shutil.copyfile(ROOT / "docs" / "layout.md", to / "docs" / "layout.md")


@pytest.mark.timeout(60)
def test_a_module_added_or_removed_fails_the_maps_until_they_are_written(tmp_path: Path) -> None:

    _copy_tree(tmp_path)
    assert MAPS.stale_indexes(root=tmp_path) == []
    (tmp_path / "runs" / "services" / "made_up.py").write_text('"""A made-up service: no more."""\n')
    (tmp_path / "runs" / "worker" / "lease.py").unlink()
    (tmp_path / "runs" / "made_up").mkdir()
    (tmp_path / "runs" / "made_up" / "__init__.py").write_text("")
    (tmp_path / "runs" / "made_up" / "part.py").write_text("# A made-up package's only part.\n")

    page = (tmp_path / "docs" / "layout.md").read_text()
    assert MAPS.unlisted(page, root=tmp_path) == ["runs/made_up/", "runs/made_up/part.py", "runs/services/made_up.py"]
    assert MAPS.stale_indexes(root=tmp_path) == [
        "runs/made_up/__init__.py: its module index is stale",
        "runs/services/__init__.py: its module index is stale",
        "runs/worker/__init__.py: its module index is stale",
        "runs/__init__.py: its module index is stale",
    ]

    assert len(MAPS.stale_indexes(write=True, root=tmp_path)) == 4
    assert MAPS.stale_indexes(root=tmp_path) == []  # written once, current
    services = (tmp_path / "runs" / "services" / "__init__.py").read_text()
    assert "#     made_up.py " in services and "A made-up service" in services
    assert "lease.py" not in (tmp_path / "runs" / "worker" / "__init__.py").read_text()
    made_up = (tmp_path / "runs" / "made_up" / "__init__.py").read_text()
    assert made_up.startswith('"""The `runs.made_up` package."""\n\n# ' + MAPS.INDEX_HEADER)
    assert "#     part.py  A made-up package's only part\n" in made_up
    listing = MAPS.listing("runs", root=tmp_path)
    assert "| `runs/services/made_up.py` | A made-up service: no more |" in listing
    assert [name for name in MAPS.unlisted(listing, root=tmp_path) if name.startswith("runs/")] == []


@pytest.mark.timeout(30)
def test_a_summary_is_the_docstrings_first_phrase_without_its_links(tmp_path: Path) -> None:

    cases = {
        '"""Webhooks (docs/design/webhooks.md): the endpoints users register; their deliveries."""': (
            "Webhooks: the endpoints users register"
        ),
        '"""The sweeper every worker runs: lapsed leases (`a: b`).\n\nMore."""': "The sweeper every worker runs",
        "class Command:\n    help = 'Claim queued runs. Then more.'\n": "Claim queued runs",
        "# Generated by Django 5.2 on a day\n# The metadata index, by hand.\n": "The metadata index, by hand",
    }
    found = {}
    for number, (source, _) in enumerate(cases.items()):
        path = tmp_path / f"m{number}.py"
        path.write_text(source)
        found[source] = MAPS.summary(path)
    assert found == cases


# --- paths the code and the manual name ------------------------------------------------------------

TOPS = ("runs", "tests", "bench", "config", "clients", "docs", "deploy", "bin", "templates")
# A path from a known top (a module, or a folder when it ends in "/"), or a module's path relative to
# some folder of the checkout (`edge/hold.py` inside runs/streaming/); not inside a URL or a longer path.
NAMED_PATH = re.compile(
    rf"(?<![\w/.{{}}<>-])((?:{'|'.join(TOPS)})/(?:[\w.-]+/)*(?:[\w-]+\.py|[\w.-]+/)|(?:[\w-]+/)+[\w-]+\.py)\b"
)
# Where the code and the manual name paths: the code's docstrings and comments, the manual's pages.
NAMING = ("runs", "tests", "bench", "config", "clients/python", "docs")
MADE = {"__pycache__", "node_modules", "results", ".test-build", "dist"}


def _docstrings(node: ast.AST) -> Iterator[tuple[int, str]]:
    """The docstrings of a module, its classes and its functions, wherever their statements nest,
    each with its first line's number."""
    body = getattr(node, "body", None)
    if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and body:
        first = body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            yield first.lineno, first.value.value
    for field in ("body", "orelse", "finalbody", "handlers"):
        inner = getattr(node, field, None)
        for child in inner if isinstance(inner, list) else []:
            yield from _docstrings(child)


def _prose(path: Path, text: str) -> Iterator[tuple[int, str]]:
    """The lines of `text` a reader reads as prose: a Python module's docstrings and comments (its
    strings are data: a URL, a template's name), every line of any other page."""
    if path.suffix != ".py":
        yield from enumerate(text.splitlines(), 1)
        return
    lines = text.splitlines()
    naming = [line for line in lines if NAMED_PATH.search(line)]
    if not naming:
        return  # nothing to look for: spare the parse
    for number, doc in _docstrings(ast.parse(text)):
        for offset, line in enumerate(doc.splitlines()):
            yield number + offset, line
    if any("#" in line for line in naming):
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                yield token.start[0], token.string


def dead_paths(texts: dict[Path, str], root: Path) -> list[str]:
    """Where `texts` (by their file under `root`) name a path the checkout does not have. A path
    relative to a folder the checkout has not at all (`reports/views.py`: a host's) is an example."""
    ends, folders = set(), set()
    for top, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in MADE and not d.startswith(".") and not d.endswith(".egg-info")]
        folders.update(dirs)
        for name in [*dirs, *names]:
            parts = (Path(top) / name).relative_to(root).parts
            ends.update("/".join(parts[i:]) for i in range(len(parts)))
    dead = []
    for path, text in texts.items():
        for number, line in _prose(path, text):
            for match in NAMED_PATH.finditer(line):
                named = match[1]
                if named.split("/")[0] in TOPS:
                    there = (root / named).exists() or bool(MADE & set(named.split("/")))
                else:
                    there = named.split("/")[0] not in folders or named.rstrip("/") in ends
                if not there:
                    dead.append(f"{path.relative_to(root)}:{number}: {named}")
    return dead


def _naming_texts() -> dict[Path, str]:
    found = {}
    for top in NAMING:
        for path in sorted((ROOT / top).rglob("*")):
            skipped = MADE & set(path.relative_to(ROOT).parts) or path.suffix not in (".py", ".md", ".html", ".js")
            if path.is_file() and not skipped and "node_modules" not in path.parts:
                found[path] = path.read_text()
    found[ROOT / "README.md"] = (ROOT / "README.md").read_text()
    return found


@pytest.mark.timeout(60)
def test_every_path_the_code_and_the_manual_name_exists() -> None:
    texts = _naming_texts()
    assert len(texts) > 300  # a search that finds nothing proves nothing
    assert dead_paths(texts, ROOT) == []


@pytest.mark.timeout(60)
def test_a_path_that_moved_is_a_dead_reference(tmp_path: Path) -> None:
    (tmp_path / "runs" / "api").mkdir(parents=True)
    (tmp_path / "runs" / "selectors").mkdir()
    (tmp_path / "runs" / "selectors" / "__init__.py").write_text("")
    module = tmp_path / "runs" / "api" / "selectors.py"
    module.write_text(
        '"""Reads of the API. They could move into `runs/selectors.py` (or runs/selectors/).\n\n'
        'See api/gone.py and reports/views.py."""\n\nURL = "runs/run/1/2/"  # beside runs/api/selectors.py\n'
    )
    assert dead_paths({module: module.read_text()}, tmp_path) == [
        "runs/api/selectors.py:1: runs/selectors.py",
        "runs/api/selectors.py:3: api/gone.py",
    ]


# --- short module docstrings ------------------------------------------------------------------------


def docstring_lines(source: str) -> int:
    """The lines of a module's docstring above its generated index (0: none)."""
    prose = MAPS.docstring_prose(source)
    return len(prose.strip("\n").splitlines()) if prose else 0


def long_docstrings(root: Path) -> list[str]:
    found = []
    for top in SHORT_DOCSTRINGS:
        for path in MAPS.modules(root / top):
            lines = docstring_lines(path.read_text())
            if lines > DOCSTRING_LINES:
                found.append(f"{path.relative_to(root)}: {lines} lines")
    return found


@pytest.mark.timeout(30)
def test_every_module_docstring_is_at_most_12_lines() -> None:
    assert long_docstrings(ROOT) == []


@pytest.mark.timeout(30)
def test_a_docstring_of_13_lines_is_too_long(tmp_path: Path) -> None:
    (tmp_path / "runs" / "p").mkdir(parents=True)
    (tmp_path / "runs" / "essay.py").write_text('"""' + "A line.\n" * 12 + 'One too many."""\n')
    (tmp_path / "runs" / "short.py").write_text('"""' + "A line.\n" * 11 + 'The twelfth."""\n')
    assert long_docstrings(tmp_path) == ["runs/essay.py: 13 lines"]


# A module longer than this is split along its purposes (a package's generated index aside).
MODULE_LINES = 450


@pytest.mark.timeout(30)
def test_no_module_of_runs_is_over_450_lines() -> None:

    long = {}
    for path in MAPS.modules(ROOT / "runs"):
        source = path.read_text()
        lines = len(source.splitlines()) - len(MAPS.index_block(source).splitlines())
        if lines > MODULE_LINES:
            long[str(path.relative_to(ROOT))] = lines
    assert long == {}


# --- no issue cited by its number -------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_no_file_of_runs_tests_or_bench_cites_an_issue_by_its_number(tmp_path: Path) -> None:
    # The issue's own check, as written: a number names nothing a reader of the code can open.
    grep = ["grep", "-rniIE", "--exclude-dir=__pycache__", r"\bissues? #?[0-9]+", "runs", "tests", "bench"]
    found = subprocess.run(grep, cwd=ROOT, capture_output=True, text=True, timeout=50)
    assert (found.returncode, found.stdout) == (1, "")
    (tmp_path / "runs" / "migrations").mkdir(parents=True)
    cited = "# As iss" + "ue #12 asked, a column."  # spelt apart, so that this file does not cite one
    (tmp_path / "runs" / "migrations" / "0099_made_up.py").write_text(cited + "\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "bench").mkdir()
    made_up = subprocess.run(grep, cwd=tmp_path, capture_output=True, text=True, timeout=10)
    assert (made_up.returncode, made_up.stdout) == (0, f"runs/migrations/0099_made_up.py:1:{cited}\n")


# --- a terse changelog ------------------------------------------------------------------------------


def changelog_problems(text: str) -> list[str]:
    """Entries over ENTRY_LINES lines or without a link to the manual, and kinds of change Keep a
    Changelog does not name."""
    problems = []
    entries: list[list[str]] = []  # each: where it starts, then its lines
    open_entry = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("### ") and line[4:].strip() not in CHANGE_KINDS:
            problems.append(f"CHANGELOG.md:{number}: {line[4:].strip()!r} is not a kind of change")
        if line.startswith("- "):
            entries.append([f"CHANGELOG.md:{number}", line])
        elif open_entry and line.startswith("  ") and line.strip():
            entries[-1].append(line)
        open_entry = line.startswith("- ") or (open_entry and line.startswith("  ") and bool(line.strip()))
    for where, *lines in entries:
        if len(lines) > ENTRY_LINES:
            problems.append(f"{where}: {len(lines)} lines")
        if "](docs/" not in " ".join(lines):
            problems.append(f"{where}: links no page of the manual")
    return problems


@pytest.mark.timeout(30)
def test_each_changelog_entry_is_short_and_links_the_manual() -> None:
    assert changelog_problems((ROOT / "CHANGELOG.md").read_text()) == []


@pytest.mark.timeout(30)
def test_a_long_or_unlinked_changelog_entry_is_refused() -> None:
    text = (
        "## [0.1.0]\n\n### Added\n\n- One line ([docs/index.md](docs/index.md)).\n"
        "- Four lines\n  two\n  three\n  four ([docs/index.md](docs/index.md)).\n\n"
        "### Improved\n\n- No link.\n"
    )
    assert changelog_problems(text) == [
        "CHANGELOG.md:11: 'Improved' is not a kind of change",
        "CHANGELOG.md:6: 4 lines",
        "CHANGELOG.md:13: links no page of the manual",
    ]
