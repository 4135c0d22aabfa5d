"""The browser build of @runledger/client that the app's pages load (runs/static/runs/runledger-client.js,
minified, and its source map beside it; docs/design/clients.md#browser): committed files, since the
wheel ships them and operators have no npm, that must be exactly what a fresh build of clients/js
writes, and that must name events as the server does."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from runs.events import EventType, browser_vocabulary
from tests.support.node import PACKAGE, built
from tests.support.procs import ROOT

# npm ci and a build: heavy for the inner loop (bin/test --quick).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

COMMITTED = ROOT / "runs" / "static" / "runs" / "runledger-client.js"


def node(*args: str) -> str:
    command = shutil.which("node")
    assert command is not None, "node is missing: bin/test installs Debian's nodejs"
    done = subprocess.run([command, *args], cwd=PACKAGE, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_committed_browser_build_is_what_a_fresh_build_of_the_package_writes(tmp_path: Path) -> None:
    built()
    fresh = tmp_path / "runledger-client.js"
    node("scripts/static.mjs", str(fresh))
    version = json.loads((PACKAGE / "package.json").read_text())["version"]
    assert fresh.read_text().startswith(f"// @runledger/client {version}: ")
    # The script names its map beside it, and the map its script and the package's TypeScript sources.
    assert fresh.read_text().endswith("\n//# sourceMappingURL=runledger-client.js.map\n")
    source_map = json.loads(fresh.with_name("runledger-client.js.map").read_text())
    assert "../../../clients/js/src/client.ts" in source_map["sources"]
    assert len(source_map["sourcesContent"]) == len(source_map["sources"])
    stale = [
        path.name
        for path in (COMMITTED, COMMITTED.with_name("runledger-client.js.map"))
        if not path.exists() or path.read_bytes() != (tmp_path / path.name).read_bytes()
    ]
    assert stale == [], (
        f"{stale} in {COMMITTED.parent.relative_to(ROOT)}: not the package's build: run `npm run build:static` in clients/js"
    )


# The committed script run as a page runs it, reporting what it spells of events.
SPELLED = """
const vm = require("node:vm"), fs = require("node:fs");
const page = {};
vm.runInNewContext(fs.readFileSync(process.argv[1], "utf8"), page);
const delta = page.Runledger.deltaText({ type: process.argv[2], data: { text: "x" } });
console.log(JSON.stringify({ terminal: page.Runledger.TERMINAL_EVENTS, delta }));
"""


def test_the_browser_build_ends_a_stream_at_the_servers_terminal_events_and_reads_its_delta_type() -> None:
    spelled = json.loads(node("-e", SPELLED, str(COMMITTED), EventType.OUTPUT_DELTA.value))
    # The watch page renders the end from the server's vocabulary; its stream ends on the package's.
    assert spelled["terminal"] == browser_vocabulary()["terminal"]
    assert spelled["delta"] == "x"
