"""The benchmarks, run from the repository's root as `python -m bench NAME` (docs/benchmarks.md#how-to-run-them).

Each module with a `main` is one benchmark; the others are their parts (lib, scenarios). Their helpers
for processes, waits and streams are the tests' own, imported from tests/support/.
"""
