"""What a callable under test is called: its label in messages, and the module:name under
which it can be loaded again (the --impl of the commands that rerun a check)."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path
from typing import Any


def label(fn: Any) -> str:
    """A callable's qualified name (of the function a partial wraps), or a target as is."""
    if isinstance(fn, str):
        return fn
    inner = fn.func if isinstance(fn, functools.partial) else fn
    return getattr(inner, "__qualname__", type(inner).__name__)


def importable_name(fn: Any) -> str:
    """module:name (path.py:name for a script's, or a module's that a fresh interpreter in
    this working directory cannot import: a test module pytest put on sys.path) under which
    `fn` itself can be loaded, found among its module's attributes; else <qualname>, which
    names it but cannot be loaded."""
    inner = fn.func if isinstance(fn, functools.partial) else fn
    module = sys.modules.get(getattr(inner, "__module__", None) or "")
    for attr, value in vars(module).items() if module is not None else ():
        if value is fn:
            file = getattr(module, "__file__", None)
            here = str(Path.cwd())
            if file and (
                module.__name__ == "__main__" or not _importable(module.__name__, file, here)
            ):
                return f"{_shown(Path(file))}:{attr}"
            return f"{module.__name__}:{attr}"
    return f"<{label(fn)}>"


def _shown(path: Path) -> Path:
    """The path relative to the working directory where it lies below it."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return path


@functools.lru_cache(maxsize=32)
def _importable(name: str, file: str, here: str) -> bool:
    """Whether `python -m linattn_verify` started in working directory `here` imports module
    `name` from `file`: its top-level package found there, where the module's is."""
    top = name.partition(".")[0]
    parents = Path(file).resolve().parents
    up = name.count(".") + (Path(file).name == "__init__.py")
    if up >= len(parents):
        return False
    try:
        found = subprocess.run(
            [sys.executable, "-c", FIND, top], capture_output=True, text=True, check=False,
            cwd=here, timeout=FIND_TIMEOUT,
        ).stdout.strip()  # fmt: skip
    except subprocess.TimeoutExpired:
        return False
    return bool(found) and Path(found).resolve() == parents[up]


FIND_TIMEOUT = 30.0  # seconds: finding a module imports nothing but its parent package
# prints the directory a top-level module or package is found in (nothing if none), without
# importing it
FIND = (
    "import importlib.util, os, sys; s = importlib.util.find_spec(sys.argv[1]); "
    "p = s and (list(s.submodule_search_locations or []) or [s.origin])[0]; "
    "print(os.path.dirname(p) if p else '')"
)
