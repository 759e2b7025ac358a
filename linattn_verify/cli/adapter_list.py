"""The adapters as `adapters` and `vet --list` print them: each one's claim, and whether its
library is installed here."""

from __future__ import annotations

import importlib.metadata

import torch

from ..adapters import ADAPTERS


def status(library: str, triton: bool) -> str:
    """'installed 1.1.4', 'not installed', or for Triton code how it runs here: 'installed
    0.6.0, Triton's interpreter (no CUDA)'."""
    try:
        version = importlib.metadata.version(library)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
    if triton and not torch.cuda.is_available():
        return f"installed {version}, Triton's interpreter (no CUDA)"
    return f"installed {version}"


def list_adapters() -> int:
    for adapter in ADAPTERS.values():
        print(
            f"{adapter.name:60} claims {adapter.spec} ({adapter.layout}); "
            f"{status(adapter.library, adapter.triton)}"
        )
    return 0
