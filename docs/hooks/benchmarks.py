"""docs/benchmarks.md's first table: the headline of the checkout's `bench/results/summary.json`
(`python -m bench run_all` writes it), rendered by bench/headline.py. docs/hooks/reference.py fills
the page's `benchmarks-headline` part with it, so the build fails while the page and the summary differ.
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
SUMMARY = ROOT / "bench" / "results" / "summary.json"


def headline(summary: Path = SUMMARY) -> str:
    """The table of `summary`'s headline, with its caption."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from bench.headline import markdown

    return markdown(json.loads(summary.read_text())["headline"])
