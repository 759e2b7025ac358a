"""The vectors' files: where they are (DEFAULT_DIR, this package's folder), how a tensor is
stored (its dtype, shape and IEEE bit patterns in hex, row-major) and read back, the JSON
bytes every file is written as, the manifest, and a stored vector's spec and tensors."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..families import family_of
from ..specs import Spec, SpecError

# the vectors' folder: this package's, with its package data (a wheel's, or the checkout's in
# an editable install), found from any folder
DEFAULT_DIR = Path(__file__).resolve().parent
BITS = {"float16": np.uint16, "bfloat16": np.uint16, "float32": np.uint32, "float64": np.uint64}


def encode(t: torch.Tensor | None) -> dict[str, Any] | None:
    """A tensor as its dtype, shape and IEEE bit patterns (hex, row-major)."""
    if t is None:
        return None
    dtype = str(t.dtype).removeprefix("torch.")
    bits = t.detach().cpu().contiguous().view(getattr(torch, f"int{t.element_size() * 8}"))
    raw = bits.numpy().astype(BITS[dtype]).ravel()
    width = t.element_size() * 2
    return {"dtype": dtype, "shape": list(t.shape), "bits": [f"{b:0{width}x}" for b in raw]}


def decode(entry: dict[str, Any] | None) -> torch.Tensor | None:
    """The tensor a vector stores (its exact values in its dtype)."""
    if entry is None:
        return None
    dtype = entry["dtype"]
    if dtype not in BITS:
        raise SpecError(f"unknown dtype {dtype!r} in a vector")
    raw = np.array([int(b, 16) for b in entry["bits"]], dtype=BITS[dtype])
    signed = torch.from_numpy(raw.view(f"int{raw.itemsize * 8}").copy())
    return signed.view(getattr(torch, dtype)).reshape(entry["shape"])


def dumps(payload: Any) -> bytes:
    """The bytes of a vector or the manifest: sorted keys, no spaces, one final newline."""
    return (json.dumps(payload, sort_keys=True, separators=(",", ":")) + "\n").encode()


def load_manifest(directory: Path = DEFAULT_DIR) -> dict[str, Any]:
    path = Path(directory) / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
        if not all(isinstance(e, dict) for e in manifest["vectors"]):
            raise TypeError("vectors must be a list of entries")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise SpecError(f"cannot read {path}: {type(err).__name__}: {err}") from None
    return manifest


def spec_of(vector: dict[str, Any]) -> Spec:
    """The spec a vector (or a manifest entry, as {"spec": entry}) states: a plain one where
    it says nothing of normalisation, scale, decay or the delta rule."""
    s = vector["spec"]
    extra = {f.name: s[f.name] for f in fields(Spec)[3:] if f.name in s}  # beyond map, causal, eps
    return Spec(s["feature_map"], causal=s["causal"], eps=s["eps"], **extra)


def stored_tensors(vector: dict[str, Any]) -> tuple[Spec, tuple[torch.Tensor | None, ...]]:
    """The vector's spec and its tensors (q, k, v, projection, and the arguments of its
    family packed as Family.pack packs them: None where there are none)."""
    spec = spec_of(vector)
    ins = vector["inputs"]
    tensors = tuple(decode(ins.get(key)) for key in ("q", "k", "v", "projection"))
    family = family_of(spec)
    given = {name: decode(ins[name]) for name in family.arguments if name in ins}
    return spec, (*tensors, family.pack(spec, given))
