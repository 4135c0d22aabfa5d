"""The benchmarks, each run from the repository's root as `python -m bench NAME`
(docs/benchmarks.md#how-to-run-them).

Each module with a `main` is one benchmark; the others are their parts (lib, scenarios, rows). The
helpers they share with the tests (processes, waits, the SSE client, the stand-in writer) are
imported from tests/support/.
"""
