"""What a result was measured on: versions, device, threads, the matmul precision flags
that change low-precision results (TF32, reduced-precision reductions), and whether the
built-in forms' C kernel is in use."""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from .families.kernelised import native

PACKAGES = ("linattn-verify", "torch", "numpy", "scipy", "mpmath", "python-flint", "hypothesis")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _git_hash() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def environment(device: str = "cpu") -> dict[str, Any]:
    """Versions, platform, device, torch threads and precision flags, git hash."""
    cuda = torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": {p: _version(p) for p in PACKAGES},
        "git": _git_hash(),
        "device": device,
        "device_name": torch.cuda.get_device_name()
        if device.startswith("cuda") and cuda
        else platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "native_kernel": native.status(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "fp16_reduced_precision_reduction": (
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
        ),
        "bf16_reduced_precision_reduction": (
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
        ),
    }
