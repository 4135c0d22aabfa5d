"""A long description as the package index shows it: the links of a README rendered by
readme_renderer (the index's own renderer, GitHub's Markdown), those that lead nowhere there, and the
file of the checkout a link into the repository names. tests/deploy/test_package.py reads the built
metadata with it, tests/docs/test_docs_links.py the READMEs themselves."""

import tomllib
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import readme_renderer.markdown

from tests.support.procs import ROOT

# The repository every absolute link names: the app's Homepage, which the client's names too.
REPOSITORY = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Homepage"]
# Where a link into the repository's default branch names a file (blob) or a folder (tree).
_KINDS = {"blob": Path.is_file, "tree": Path.is_dir}


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.addresses: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("href", "src") and value is not None:
                self.addresses.append(value)
            elif name == "id" and value is not None:
                self.ids.add(value)


def _rendered(markdown: str) -> _Links:
    html = readme_renderer.markdown.render(markdown, variant="GFM")
    assert html is not None, "the package index could not render the description"
    links = _Links()
    links.feed(html)
    return links


def description_links(markdown: str) -> list[str]:
    """Every address a Markdown description links (`href`) or shows (`src`) once the index has
    rendered it: inline, reference and automatic links, images and raw HTML alike, in page order. A
    link to one of its own headings reads `#user-content-<id>` there, as the index gives them."""
    return _rendered(markdown).addresses


def links_that_lead_nowhere(markdown: str) -> list[str]:
    """The addresses of a description that break on the package index: each without a scheme and a
    host (a path the repository would resolve, the index does not), or naming a heading the page
    does not have."""
    links = _rendered(markdown)
    broken = []
    for address in links.addresses:
        if address.startswith("#"):
            if address[1:] not in links.ids:
                broken.append(address)
            continue
        parts = urlsplit(address)
        if parts.scheme not in ("https", "http", "mailto") or (parts.scheme != "mailto" and not parts.netloc):
            broken.append(address)
    return broken


def repository_path(address: str) -> Path | None:
    """The file or folder of the checkout that a link into the repository's main branch names (the
    checkout itself for the repository's home); None for any other address. AssertionError when it
    names one the checkout lacks, a file as a folder, or a heading: GitHub gives headings other ids
    than the manual's (an explicit `{#id}` is MkDocs' alone), so a link names the page."""
    if address.rstrip("/") == REPOSITORY:
        return ROOT
    prefix = f"{REPOSITORY}/"
    if not address.startswith(prefix):
        return None
    kind, _, rest = address.removeprefix(prefix).partition("/")
    branch, _, path = rest.partition("/")
    if kind not in _KINDS or branch != "main":
        return None
    assert "#" not in path, f"{address}: a heading's id differs between GitHub and the manual"
    target = ROOT / path
    assert _KINDS[kind](target), f"{address}: the checkout has no {'file' if kind == 'blob' else 'folder'} {path}"
    return target
