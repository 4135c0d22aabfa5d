"""`python -m bench NAME [OPTIONS]`: runs the benchmark NAME (`python -m bench` lists them)."""

import ast
import importlib
import pkgutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def benchmarks() -> list[str]:
    """The modules of bench/ that define a top-level `main`, read without importing them (most need a
    database set up first)."""
    found = []
    for module in pkgutil.iter_modules([str(HERE)]):
        tree = ast.parse((HERE / f"{module.name}.py").read_text())
        if any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body):
            found.append(module.name)
    return sorted(found)


def run(argv: list[str]) -> int:
    names = benchmarks()
    if not argv or argv[0] not in names:
        asked = not argv or argv[0] in ("-h", "--help")
        out = sys.stdout if asked else sys.stderr
        print("usage: python -m bench NAME [OPTIONS]   (python -m bench NAME --help: its options)", file=out)
        print("benchmarks: " + ", ".join(names), file=out)
        return 0 if asked else 2
    from bench.lib import uncap

    uncap()
    sys.argv = [f"python -m bench {argv[0]}", *argv[1:]]
    return int(importlib.import_module(f"bench.{argv[0]}").main() or 0)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
