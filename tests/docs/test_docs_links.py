"""Every `docs/<page>.md#anchor` the code cites exists: the page, and a heading with that id.

Comments and docstrings point at the manual (`docs/design/execution.md#leases`) rather than at any
document outside the repository. A heading's id is what MkDocs' toc extension gives it: an explicit
`{#id}` (attr_list), else its text slugified — inline markup dropped, lower case, punctuation
removed, spaces to "-", a repeated id suffixed `_1`, `_2`. Plain Python: no MkDocs run.

The READMEs are read elsewhere too: each is a distribution's description on the package index,
where only a link in full works, so each link into the repository names a file or folder of the
checkout by its address on the main branch."""

import re
import unicodedata
from pathlib import Path

import pytest

from tests.support.descriptions import REPOSITORY, description_links, links_that_lead_nowhere, repository_path

pytestmark = pytest.mark.sqlite

ROOT = Path(__file__).resolve().parents[2]
# The distributions' long descriptions (the app's and the client's pyproject.toml name them).
READMES = ["README.md", "clients/python/README.md"]
CITING = ["runs", "tests", "bench", "config", "clients", "deploy", "bin"]
SUFFIXES = {
    "",
    ".py",
    ".js",
    ".ts",
    ".mjs",
    ".tsx",
    ".html",
    ".css",
    ".sh",
    ".service",
    ".template",
    ".conf",
    ".toml",
    ".md",
    ".txt",
}
# What a build or an install made (clients/js: its dependencies, its build, its compiled tests).
MADE = {"__pycache__", "results", "node_modules", "dist", ".test-build"}
CITATION = re.compile(r"\bdocs/((?:[\w.-]+/)*[\w.-]+\.md)(?:#([\w-]+))?")
# A test module named by its path from the checkout's root (the Python client's own tests too),
# perhaps with one of its tests: `<path>::<test>`.
TEST_FILE = re.compile(r"(?<![\w/.-])((?:clients/python/)?tests/(?:[\w-]+/)*[\w-]+\.py)(?:::(\w+))?")
# Where the manual, the READMEs, the changelog and the project's files name test modules.
NAMING_TESTS = ["docs", "README.md", "CHANGELOG.md", "pyproject.toml", *CITING]
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
EXPLICIT_ID = re.compile(r"\{[^}]*#([\w-]+)[^}]*\}\s*$")


def slugify(text: str) -> str:
    """Python-Markdown's toc slug of a heading's text (after its inline markup is rendered away)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links keep their text
    text = re.sub(r"[`*]", "", text)  # code spans and emphasis keep their text
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def heading_ids(page: Path) -> set[str]:
    ids: set[str] = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match is None:
            continue
        text = match.group(1)
        explicit = EXPLICIT_ID.search(text)
        if explicit:
            ids.add(explicit.group(1))
            continue
        slug, n = slugify(text), 0
        while (slug if n == 0 else f"{slug}_{n}") in ids:
            n += 1
        ids.add(slug if n == 0 else f"{slug}_{n}")
    return ids


def citing_files() -> list[Path]:
    files = []
    for top in CITING:
        for path in sorted((ROOT / top).rglob("*")):
            parts = set(path.relative_to(ROOT).parts)
            if path.is_file() and path.suffix in SUFFIXES and not parts & MADE:
                files.append(path)
    return files


def citations() -> list[tuple[str, str, str | None]]:
    found = []
    for path in citing_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for match in CITATION.finditer(line):
                found.append((f"{path.relative_to(ROOT)}:{number}", match.group(1), match.group(2)))
    return found


def test_the_slug_rule_is_the_toc_extensions() -> None:
    assert slugify("Leases, heartbeats and fencing") == "leases-heartbeats-and-fencing"
    assert slugify("Requeue and `max_attempts`") == "requeue-and-max_attempts"
    assert slugify("Cancel, stop — disconnect") == "cancel-stop-disconnect"


def test_every_cited_page_and_anchor_exists() -> None:
    found = citations()
    assert len(found) > 100  # the code cites the manual everywhere; a broken search finds nothing
    ids: dict[str, set[str]] = {}
    broken = []
    for where, page, anchor in found:
        path = ROOT / "docs" / page
        if not path.is_file():
            broken.append(f"{where}: docs/{page} does not exist")
            continue
        if anchor is not None and anchor not in ids.setdefault(page, heading_ids(path)):
            broken.append(f"{where}: docs/{page} has no heading #{anchor}")
    assert broken == []


def test_every_named_test_module_and_test_exists() -> None:
    # A test module moved or split, and a page, a comment or a threat table still naming where it was.
    named, broken = 0, []
    for top in NAMING_TESTS:
        paths = [ROOT / top] if (ROOT / top).is_file() else sorted((ROOT / top).rglob("*"))
        for path in paths:
            parts = path.relative_to(ROOT).parts
            made = set(parts) & MADE or any(part.endswith(".egg-info") for part in parts)
            if not path.is_file() or path.suffix not in SUFFIXES or made:
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                for match in TEST_FILE.finditer(line):
                    named += 1
                    module, test = ROOT / match.group(1), match.group(2)
                    where = f"{path.relative_to(ROOT)}:{number}: {match.group(0)}"
                    if not module.is_file():
                        broken.append(f"{where}: no such file")
                    elif test is not None and not re.search(rf"^(async )?def {test}\(", module.read_text(), re.M):
                        broken.append(f"{where}: no such test")
    assert named > 50  # docs/security.md alone names dozens; a broken search finds nothing
    assert broken == []


def test_the_code_cites_no_document_outside_the_repository() -> None:
    # Spelt apart, so that this file does not cite them itself.
    design, shared = "DESIGN " + "§", "shared" + "/"
    cited = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in citing_files()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if design in line or shared in line
    ]
    assert cited == []


def test_the_code_cites_no_issue_by_its_number() -> None:
    # An issue's number names nothing a reader of the code can open: the code says what it means.
    number = re.compile(r"\bissues? #?[0-9]+", re.IGNORECASE)
    cited = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in citing_files()
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if number.search(line)
    ]
    assert cited == []


@pytest.mark.parametrize("readme", READMES)
def test_each_readme_links_in_full_to_what_the_checkout_has(readme: str) -> None:
    text = (ROOT / readme).read_text()
    assert links_that_lead_nowhere(text) == []
    into_the_repository = [link for link in description_links(text) if link.startswith(REPOSITORY)]
    assert into_the_repository  # a README that links nothing of the repository is not what this reads
    for link in into_the_repository:
        repository_path(link)  # a file or folder the checkout has, when the link names one
