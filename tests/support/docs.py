"""The manual's code, as the tests run it: fenced blocks read from docs/ pages (so a page cannot
drift from what is tested), and a shell session that runs a page's shell blocks one after another,
as a reader types them into one terminal.

A block the tests run carries a title on its fence, which the built site shows above it:
```` ```sh title="Create a run" ````. The tests find blocks by that title. Also the renderer of the
reference pages' generated parts (docs/hooks/reference.py), as the docs' build loads it, the
maps of the code it writes (docs/hooks/maps.py) and the benchmarks' headline (docs/hooks/benchmarks.py).
"""

import os
import queue
import re
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from mkdocs.config import load_config

from tests.support.procs import ROOT

DOCS = ROOT / "docs"

# A fence at the start of a line (pages indent no runnable block), its language, its options.
_FENCE = re.compile(r"^```(?P<lang>[\w-]*)(?P<options>[^\n]*)\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_TITLE = re.compile(r'title="(?P<title>[^"]*)"')


@dataclass(frozen=True)
class Block:
    lang: str
    title: str | None
    text: str


def code_blocks(page: str) -> list[Block]:
    """Every fenced block of docs/`page`, in page order."""
    blocks = []
    for fence in _FENCE.finditer((DOCS / page).read_text()):
        title = _TITLE.search(fence["options"])
        blocks.append(Block(fence["lang"], title["title"] if title else None, fence["body"]))
    return blocks


def titled(page: str, lang: str) -> dict[str, str]:
    """The blocks of `lang` with a title on docs/`page`, by title, in page order."""
    found: dict[str, str] = {}
    for block in code_blocks(page):
        if block.lang == lang and block.title is not None:
            assert block.title not in found, f"docs/{page}: two {lang} blocks titled {block.title!r}"
            found[block.title] = block.text
    return found


def reference_renderer() -> ModuleType:
    """docs/hooks/reference.py: the renderer of the reference pages' generated parts, as `mkdocs build`
    loads it (mkdocs.yml `hooks:`)."""
    hook: ModuleType = load_config(str(ROOT / "mkdocs.yml"))["hooks"]["docs/hooks/reference.py"]
    return hook


def code_maps() -> ModuleType:
    """docs/hooks/maps.py: the maps of the code (docs/layout.md's listings, the package indexes)."""
    maps: ModuleType = reference_renderer().sibling("maps")
    return maps


def benchmarks_headline() -> ModuleType:
    """docs/hooks/benchmarks.py: docs/benchmarks.md's first table, from bench/results/summary.json."""
    headline: ModuleType = reference_renderer().sibling("benchmarks")
    return headline


def generated_part(page: str, name: str) -> str:
    """The generated part `name` of docs/`page`, as the page holds it now."""
    parts = {match["name"]: match["body"] for match in reference_renderer().PART.finditer((DOCS / page).read_text())}
    assert name in parts, f"docs/{page} has no generated part {name!r}"
    return parts[name]


def listed_names(page: str, anchor: str) -> set[str]:
    """The names the section `{#anchor}` of docs/`page` lists in its first code span, comma-separated
    (`id, agent, last_run ({"id", "status"} or null)`), each without what it says of itself in brackets."""
    text = (DOCS / page).read_text()
    start = text.index(f"{{#{anchor}}}")
    span = re.search(r"`([^`]+)`", text[start : text.find("\n## ", start)])
    assert span is not None, f"docs/{page}#{anchor} lists no names"
    return {name.strip() for name in re.sub(r"\([^)]*\)", "", span[1]).split(",")}


def block(page: str, lang: str, title: str) -> str:
    """The one block of `lang` titled `title` on docs/`page`."""
    blocks = titled(page, lang)
    assert title in blocks, f"docs/{page} has no {lang} block titled {title!r}: {sorted(blocks)}"
    return blocks[title]


class Shell:
    """One bash session (no profile, no rc file), fed block by block: variables a block sets are
    there for the next, as in a reader's terminal. Stop it with `close()`."""

    def __init__(self, env: dict[str, str], cwd: Path = ROOT) -> None:
        self._process = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def run(self, text: str, timeout: float = 60) -> str:
        """Run `text` in the session; what it printed (stdout and stderr) once it is done."""
        assert self._process.stdin is not None
        marker = f"__block_done_{uuid.uuid4().hex}__"
        # A line of its own, whatever the block's last output lacked; $? is the block's status.
        self._process.stdin.write(f"{text}\nprintf '\\n%s %s\\n' {marker} \"$?\"\n")
        self._process.stdin.flush()
        out: list[str] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(
                    f"the block did not finish within {timeout}s:\n{text}\n---\n{''.join(out)}"
                ) from None
            if line is None:
                raise RuntimeError(f"the shell exited during the block:\n{text}\n---\n{''.join(out)}")
            if line.startswith(marker):
                # The newline printed before the marker is not the block's.
                return "".join(out)[:-1] if out and out[-1] == "\n" else "".join(out)
            out.append(line)

    def close(self) -> None:
        if self._process.poll() is None:
            assert self._process.stdin is not None
            self._process.stdin.close()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                # The session and whatever a block left running in it (its own process group).
                os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait(timeout=10)
