"""docs/how-to/frontend.md is the React example app (clients/js/examples/react-app) file for file,
and bundles it as the package's `build:example` script does: the guide a reader follows and the app
the browser test drives (tests/client/test_react_example_browser.py) cannot drift apart."""

import json

import pytest

from tests.support.docs import block, code_blocks
from tests.support.node import EXAMPLE, PACKAGE

pytestmark = pytest.mark.sqlite

GUIDE = "how-to/frontend.md"
# What a build or a reader made in the example's folder: never on the page.
MADE = {"dist", "node_modules", "config.json"}


def test_the_guide_shows_every_file_of_the_example_as_it_is() -> None:
    files = {
        str(path.relative_to(EXAMPLE)): path.read_text()
        for path in sorted(EXAMPLE.rglob("*"))
        if path.is_file() and path.relative_to(EXAMPLE).parts[0] not in MADE
    }
    shown = {found.title: found.text for found in code_blocks(GUIDE) if found.title in files}
    assert {"index.html", "src/main.tsx", "src/App.tsx"} <= set(files)
    assert shown == files


def test_the_guide_bundles_the_example_as_the_packages_build_example_script_does() -> None:
    script = json.loads((PACKAGE / "package.json").read_text())["scripts"]["build:example"]
    into_the_example = f"cd {EXAMPLE.relative_to(PACKAGE)} && "
    assert script.startswith(into_the_example)
    command = block(GUIDE, "sh", "Type-check and bundle it").strip()
    assert command.replace("npx ", "") == script.removeprefix(into_the_example)
