"""The package's import graph (grimp, imports inside functions counted): no import circle, and
no import inside a function but of a heavy optional dependency."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp

import linattn_verify

PACKAGE = Path(linattn_verify.__file__).parent
# heavy optional dependencies, which a function may import when it needs them
# (scipy: 0.6 s to import, which every vet run would pay for the random-feature statistics)
ALLOWED_INSIDE_FUNCTIONS = ("triton", "matplotlib", "scipy")


def _circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module: each module with those it
    imports that import it back (directly or not)."""
    circles = set()
    for module in graph.modules:
        back = graph.find_upstream_modules(module) & graph.find_downstream_modules(module)
        if back:
            circles.add(tuple(sorted({module, *back})))
    return [list(c) for c in sorted(circles)]


def test_no_import_circle() -> None:
    circles = _circles(grimp.build_graph("linattn_verify", cache_dir=None))
    assert not circles, "import circles:\n" + "\n".join("  " + ", ".join(c) for c in circles)


def _imports_inside_functions(path: Path) -> list[tuple[int, str]]:
    """(line, module) of each import inside a function of the file (relative: with dots)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import):
                    found |= {(inner.lineno, alias.name) for alias in inner.names}
                elif isinstance(inner, ast.ImportFrom):
                    found.add((inner.lineno, "." * inner.level + (inner.module or "")))
    return sorted(found)


def test_imports_inside_functions_are_of_heavy_optional_dependencies() -> None:
    paths = sorted(PACKAGE.rglob("*.py"))
    hidden = [
        f"{path.relative_to(PACKAGE)}:{line}: {module}"
        for path in paths
        for line, module in _imports_inside_functions(path)
        if module.split(".")[0] not in ALLOWED_INSIDE_FUNCTIONS
    ]
    assert not hidden, "imports inside functions:\n" + "\n".join(hidden)
