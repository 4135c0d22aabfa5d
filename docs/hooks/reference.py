"""The reference pages' generated parts, rendered from the code, so that they cannot drift.

A page marks each generated part:

    <!-- generated: settings -->
    ...what `render("settings")` returns...
    <!-- end generated -->

As an MkDocs hook (mkdocs.yml `hooks:`) it fails the build when a page's part differs from what the
code renders now — a setting added, an endpoint changed, a CLI option renamed. Run as a script it
rewrites the parts:

    .venv/bin/python docs/hooks/reference.py --write

Also the maps of the code (docs/hooks/maps.py): docs/layout.md's listings and the module index that
ends each package docstring of runs/ and tests/support/__init__.py; and docs/benchmarks.md's first
table, from bench/results/summary.json (docs/hooks/benchmarks.py).

Sources: the settings registries (runs/conf.py, config/environment.py), the OpenAPI schema the app
serves (runs/api/schema.py), the CLI's parser (clients/python/runledger_client/cli.py), the event
vocabulary (runs/events.py), the end codes (runs/transitions.py), the error codes
(runs/http/errors.py) and the public Python API (PUBLIC_MODULES: their `__all__`, as written).
"""

import argparse
import ast
import importlib.util
import inspect
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
DOCS = ROOT / "docs"
PART = re.compile(r"(<!-- generated: (?P<name>[a-z-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.DOTALL)


def sibling(name: str) -> Any:
    """docs/hooks/`name`.py, loaded from its file as MkDocs loads this one (a hook is no package)."""
    spec = importlib.util.spec_from_file_location(f"docs_hooks_{name}", Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _maps() -> Any:
    return sibling("maps")


def _django() -> None:
    for path in (ROOT, ROOT / "clients" / "python"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    # The standalone site's defaults, whatever the shell running the build has set.
    for name in ("DATABASE_URL", "RUNLEDGER_GRIP_URL"):
        os.environ.pop(name, None)
    import django

    django.setup()


def _settings() -> str:
    from config.environment import Site
    from runs.conf import AppSettings

    return (
        "### The app's settings\n\nDjango settings, in a project's settings module; environment variables of the "
        "same names where the settings module takes them (`settings_from_environment()`).\n\n"
        + AppSettings.reference()
        + "\n### The standalone site's environment\n\nRead by `config/settings.py` only; a project hosting "
        "the `runs` app sets its own equivalents.\n\n" + Site.reference()
    )


def _sse_settings() -> str:
    from runs.conf import AppSettings

    rows = ["| Setting | Default | What it does |", "|---|---|---|"]
    for s in AppSettings.declared():
        if s.name.startswith("RUNLEDGER_SSE_") or s.name == "RUNLEDGER_MAX_STREAMS_PER_USER":
            rows.append(f"| `{s.name}` | {s.default_text()} | {s.doc} |")
    return "\n".join(rows) + "\n"


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _schema_type(schema: dict[str, Any], components: dict[str, Any]) -> str:
    if "$ref" in schema:
        return f"`{schema['$ref'].rsplit('/', 1)[1]}`"
    if "allOf" in schema:
        return " & ".join(_schema_type(s, components) for s in schema["allOf"])
    if "oneOf" in schema:
        return " or ".join(_schema_type(s, components) for s in schema["oneOf"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_schema_type(schema.get('items', {}), components)}"
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"] if v is not None)
    return f"{kind}" + (f" ({schema['format']})" if "format" in schema else "")


def _api() -> str:
    from django.test import Client

    response = Client(HTTP_HOST="localhost").get("/api/schema/", {"format": "json"})
    schema = json.loads(response.content)
    components = schema.get("components", {}).get("schemas", {})
    out: list[str] = []
    for path, operations in schema["paths"].items():
        for method, op in operations.items():
            if method not in {"get", "post", "put", "patch", "delete", "head"}:
                continue
            out.append(f"### `{method.upper()} {path}`\n")
            if op.get("summary"):
                out.append(f"{op['summary']}\n")
            if op.get("description"):
                out.append(f"{op['description'].strip()}\n")
            params = op.get("parameters", [])
            if params:
                out += ["| Parameter | In | Type | Required | Description |", "|---|---|---|---|---|"]
                for p in params:
                    out.append(
                        f"| `{p['name']}` | {p['in']} | {_schema_type(p.get('schema', {}), components)} "
                        f"| {'yes' if p.get('required') else 'no'} | {_cell(p.get('description', ''))} |"
                    )
                out.append("")
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body:
                out.append(f"Request body: {_schema_type(body['schema'], components)}\n")
            out += ["| Status | Body | Meaning |", "|---|---|---|"]
            for status, answer in op["responses"].items():
                content: dict[str, Any] = answer.get("content", {})
                shape = next(iter(content.values())).get("schema") if content else None
                kind = _schema_type(shape, components) if shape else "—"
                out.append(f"| {status} | {kind} | {_cell(answer.get('description', ''))} |")
            out.append("")
    out.append("### Schemas\n")
    for name, component in sorted(components.items()):
        out.append(f"#### `{name}`\n")
        if component.get("description"):
            out.append(_cell(component["description"]) + "\n")
        properties = component.get("properties")
        if properties:
            required = set(component.get("required", []))
            out += ["| Field | Type | Required | Description |", "|---|---|---|---|"]
            for field, spec in properties.items():
                nullable = " or null" if spec.get("nullable") else ""
                read_only = " (read-only)" if spec.get("readOnly") else ""
                out.append(
                    f"| `{field}` | {_schema_type(spec, components)}{nullable}{read_only} "
                    f"| {'yes' if field in required else 'no'} | {_cell(spec.get('description', ''))} |"
                )
        elif "enum" in component:
            out.append(f"One of {_schema_type(component, components)}.")
        out.append("")
    return "\n".join(out)


def _cli() -> str:
    from runledger_client._cli_args import every_command
    from runledger_client.cli import parser

    os.environ["COLUMNS"] = "100"
    top = parser()
    out = ["```text", top.format_help().rstrip(), "```", ""]
    for name, sub in every_command(top).items():
        out += [f"### `runledger {name}`", "", "```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(out)


def _events() -> str:
    from runs.events import AGENT_TYPES, EVENT_DATA, LIFECYCLE_TYPES

    out = []
    for type_, (meaning, fields) in EVENT_DATA.items():
        who = "the platform" if type_ in LIFECYCLE_TYPES else "the agent" if type_ in AGENT_TYPES else "the platform"
        out += [f"### `{type_}`", "", f"{meaning} Written by {who}.", "", "| `data` key | Meaning |", "|---|---|"]
        out += [f"| `{key}` | {_cell(text)} |" for key, text in fields.items()]
        out.append("")
    return "\n".join(out)


def _errors() -> str:
    from runs.http.errors import ERROR_CODES

    rows = ["| `error.code` | Status | Meaning |", "|---|---|---|"]
    rows += [f"| `{code}` | {status} | {_cell(meaning)} |" for code, (status, meaning) in ERROR_CODES.items()]
    return "\n".join(rows) + "\n"


def _end_codes() -> str:
    from runs.transitions import END_CODE_MEANINGS, END_CODES

    rows = ["| Status | `end_code` | Meaning |", "|---|---|---|"]
    for status, codes in END_CODES.items():
        for code in sorted(codes):
            meaning = END_CODE_MEANINGS.get(code, "the agent finished") if code else "the agent finished"
            rows.append(f"| `{status}` | {f'`{code}`' if code else '(empty)'} | {_cell(meaning)} |")
    return "\n".join(rows) + "\n"


# The public Python API (docs/reference/python.md): each module's `__all__`, in this order.
PUBLIC_MODULES = ("runs.services", "runs.selectors", "runs.signals", "runs.exceptions")
_DOC_LINK = re.compile(r"\bdocs/(?P<page>[\w/-]+\.md(?:#[\w-]+)?)")


def public_api() -> dict[str, dict[str, Any]]:
    """Every public name of PUBLIC_MODULES, by module, as the module exports it."""
    import importlib

    found: dict[str, dict[str, Any]] = {}
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        found[name] = {public: getattr(module, public) for public in module.__all__}
    return found


def definition(module: str, name: str) -> tuple[ast.AST, str, str | None]:
    """The top-level statement of `module` that defines `name`, the module's source, and its
    docstring (a variable's is the string just below it). Read from the source, as written."""
    source = Path(sys.modules[module].__file__ or "").read_text()
    body = ast.parse(source).body
    for index, node in enumerate(body):
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == name:
            return node, source, ast.get_docstring(node)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            after = body[index + 1] if index + 1 < len(body) else None
            text = after.value.value if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) else None
            return node, source, inspect.cleandoc(text) if isinstance(text, str) else None
    raise LookupError(f"{module} defines no {name}")


def _signature(node: ast.FunctionDef, source: str) -> str:
    def param(arg: ast.arg, default: ast.expr | None, prefix: str = "") -> str:
        text = prefix + arg.arg + (f": {ast.get_source_segment(source, arg.annotation)}" if arg.annotation else "")
        return text + (f" = {ast.get_source_segment(source, default)}" if default is not None else "")

    args = node.args
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    parts = [param(arg, default) for arg, default in zip(positional, [*defaults, *args.defaults], strict=True)]
    if args.vararg or args.kwonlyargs:
        parts.append(param(args.vararg, None, "*") if args.vararg else "*")
    parts += [param(arg, default) for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    if args.kwarg:
        parts.append(param(args.kwarg, None, "**"))
    returns = f" -> {ast.get_source_segment(source, node.returns)}" if node.returns else ""
    # As a stub (`: ...`), so that the block is Python that ruff format leaves as it is.
    inline = f"def {node.name}({', '.join(parts)}){returns}: ..."
    if len(inline) <= 100:
        return inline
    return f"def {node.name}(\n" + "".join(f"    {part},\n" for part in parts) + f"){returns}: ..."


def _declaration(node: ast.AST, source: str) -> str:
    """A function's signature; a class's header, decorators and class-level fields; a variable's
    assignment — each as the source spells it."""
    if isinstance(node, ast.FunctionDef):
        return _signature(node, source)
    if isinstance(node, ast.ClassDef):
        lines = [f"@{ast.get_source_segment(source, d)}" for d in node.decorator_list]
        bases = ", ".join(ast.get_source_segment(source, b) or "" for b in node.bases)
        header = f"class {node.name}({bases}):" if bases else f"class {node.name}:"
        fields = [s for s in node.body if isinstance(s, ast.AnnAssign | ast.Assign)]
        if not fields:
            return "\n".join([*lines, f"{header} ..."])
        return "\n".join([*lines, header, *(f"    {ast.get_source_segment(source, s)}" for s in fields)])
    return ast.get_source_segment(source, node) or ""


def _python() -> str:
    out = []
    for module, names in public_api().items():
        out.append(f"### `{module}` {{#{module.replace('.', '-')}}}\n")
        for name, obj in names.items():
            node, source, doc = definition(getattr(obj, "__module__", module) if callable(obj) else module, name)
            if not doc:
                raise LookupError(f"{module}.{name} is public but has no docstring")
            doc = _DOC_LINK.sub(lambda m: f"[{m['page']}](../{m['page']})", doc)
            out += [f"#### `{name}`\n", "```python", _declaration(node, source), "```", "", doc, ""]
    return "\n".join(out)


RENDERERS: dict[str, Callable[[], str]] = {
    "settings": _settings,
    "sse-settings": _sse_settings,
    "api": _api,
    "cli": _cli,
    "events": _events,
    "errors": _errors,
    "end-codes": _end_codes,
    "python": _python,
    "layout-runs": lambda: _maps().listing("runs"),
    "layout-tests": lambda: _maps().listing("tests"),
    "layout-bench": lambda: _maps().listing("bench"),
    "layout-clients": lambda: _maps().listing("clients/python"),
    "benchmarks-headline": lambda: sibling("benchmarks").headline(),
}


def render(name: str) -> str:
    text = RENDERERS[name]()
    return text if text.endswith("\n") else text + "\n"


def stale(write: bool = False) -> list[str]:
    """The generated parts that differ from what the code renders (rewritten when `write`)."""
    _django()
    found: list[str] = _maps().stale_indexes(write)
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()

        def fill(match: re.Match[str], page: Path = page) -> str:
            name = match["name"]
            if name not in RENDERERS:
                found.append(f"{page.relative_to(ROOT)}: no renderer is called {name!r}")
                return match[0]
            body = render(name)
            if body != match["body"]:
                found.append(f"{page.relative_to(ROOT)}: the part {name!r} is stale")
            return match[1] + body + match[4]

        new = PART.sub(fill, text)
        if write and new != text:
            page.write_text(new)
    return found


def on_pre_build(config: Any) -> None:
    from mkdocs.exceptions import PluginError

    problems = stale()
    if problems:
        raise PluginError("; ".join(problems) + " — rewrite with: .venv/bin/python docs/hooks/reference.py --write")


if __name__ == "__main__":
    options = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options.add_argument("--write", action="store_true", help="rewrite the stale parts")
    written = stale(write=options.parse_args().write)
    print("\n".join(written) or "every generated part is current")
