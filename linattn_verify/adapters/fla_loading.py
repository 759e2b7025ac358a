"""How the fla adapters load fla-core 0.6.0: one pure-PyTorch file of fla by itself (no
triton, fla/__init__.py never run), or fla.ops.<module> (the Triton kernels) without fla's
platform warning."""

from __future__ import annotations

import functools
import importlib.util
import warnings
from pathlib import Path
from types import ModuleType

from .base import AdapterUnavailable, import_library

INSTALL = "fla-core==0.6.0 einops"
INSTALL_TRITON = "fla-core==0.6.0 einops triton==3.9.0 numpy packaging"


@functools.cache
def fla_file(relative: str) -> ModuleType:
    """One pure-PyTorch file of fla, executed by itself (it imports only torch and einops).

    importlib.util.find_spec("fla") locates the package without running fla/__init__.py
    (which imports fla.layers, fla.models and the Triton kernels): find_spec imports the
    parents of a dotted name only, and "fla" has none. Nothing is stubbed.
    """
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        raise AdapterUnavailable(f"fla is not installed; `pip install --no-deps {INSTALL}`")
    path = Path(next(iter(spec.submodule_search_locations)), relative)
    name = "_linattn_verify_fla_" + relative.removesuffix(".py").replace("/", "_")
    file_spec = importlib.util.spec_from_file_location(name, path)
    if file_spec is None or file_spec.loader is None or not path.is_file():
        raise AdapterUnavailable(f"{path} is missing: this fla is not fla-core 0.6.0")
    module = importlib.util.module_from_spec(file_spec)
    try:
        file_spec.loader.exec_module(module)
    except ImportError as err:
        raise AdapterUnavailable(
            f"cannot load {path} ({err}); `pip install --no-deps {INSTALL}`"
        ) from None
    return module


def triton_ops(module: str) -> ModuleType:
    """fla.ops.<module>, without fla's warning that Triton "is not supported on current
    platform" (true of CUDA here: its kernels run in Triton's interpreter)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Triton is not supported on current platform")
        return import_library(f"fla.ops.{module}", INSTALL_TRITON)
