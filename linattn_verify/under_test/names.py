"""What a callable under test is called: its label in messages, and the module:name under
which it can be loaded again (the --impl of the commands that rerun a check)."""

from __future__ import annotations

import functools
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
    """module:name (path.py:name for a script's) under which `fn` itself can be loaded, found
    among its module's attributes; else <qualname>, which names it but cannot be loaded."""
    inner = fn.func if isinstance(fn, functools.partial) else fn
    module = sys.modules.get(getattr(inner, "__module__", None) or "")
    for attr, value in vars(module).items() if module is not None else ():
        if value is fn:
            if module.__name__ == "__main__" and getattr(module, "__file__", None):
                return f"{Path(module.__file__)}:{attr}"
            return f"{module.__name__}:{attr}"
    return f"<{label(fn)}>"
