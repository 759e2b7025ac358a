"""The commands that name an implementation again: its options (the claim's words, from
claim.CLAIM) and the line that reruns a check on a case."""

from __future__ import annotations

import functools
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..adapters import ADAPTERS
from .claim import CLAIM, DECLARED, SOURCE, SPEC_FIELDS, default_cost, words

if TYPE_CHECKING:
    from ..cases import Case
    from .implementation import Implementation


def command(impl: Implementation) -> str:
    """The options that name `impl` to a command (`check`, `vet`, ...): what resolve takes."""
    kind, name = impl.source.kind, impl.source.name
    if kind == "adapter":  # its spec and layout are its own
        cost = impl.cost if impl.cost != ADAPTERS[name].cost else None
        state = DECLARED if impl.state is not None else None
        given = {"cost": cost, "state": state, "varlen": impl.varlen, **_triton(impl),
                 "dot_precision": impl.spec.dot_precision}  # fmt: skip
        return shlex.join(["--impl", name, *words(CLAIM, given)])
    if kind == "form":
        source = words(SOURCE, {"form": name, "chunk_size": impl.source.chunk_size})
        state = DECLARED if impl.state is not None else None
    else:
        source = ["--impl", name if kind == "target" else _importable_name(impl.fn)]
        state = impl.state
    default = default_cost(impl.spec, name if kind == "form" else None)
    values = {f: getattr(impl.spec, f) for f in SPEC_FIELDS} | {
        "layout": impl.layout,
        "cost": impl.cost if impl.cost != default else None,
        "state": state,
        "varlen": impl.varlen,
        **_triton(impl),
    }
    return shlex.join([*source, *words(CLAIM, values)])


def _triton(impl: Implementation) -> dict[str, Any]:
    """How its Triton kernels run, said even where it is automatic (so that a command copied
    to a machine with a GPU runs what it ran here)."""
    return {"triton": impl.triton, "tf32": impl.tf32}


def reproduce(impl: Implementation, check: str, case: Case) -> str:
    """One line that reruns check `check` on `case`."""
    return (
        f"python -m linattn_verify check {check} {command(impl)} "
        f"--case {shlex.quote(case.to_json())}"
    )


def label(fn: Any) -> str:
    """A callable's qualified name (of the function a partial wraps), or a target as is."""
    if isinstance(fn, str):
        return fn
    inner = fn.func if isinstance(fn, functools.partial) else fn
    return getattr(inner, "__qualname__", type(inner).__name__)


def _importable_name(fn: Any) -> str:
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
