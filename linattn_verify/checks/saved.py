"""A case written out for a debugger (`check ... --case JSON --save case.npz`): its tensors,
the implementation's output and the exact reference, in one .npz file that numpy reads
without this package."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from ..cases import Case
from ..families import case_arguments, exact, family_of, validate
from ..under_test import Implementation, ImplementationFailure


def _array(t: torch.Tensor) -> np.ndarray:
    """A numpy copy; bfloat16, which numpy lacks, as float32 (every bfloat16 is one)."""
    t = t.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def save_case(impl: Implementation, case: Case, path: Path) -> str:
    """Write q, k, v (B, H, N, d), projection (m, d) when the spec has one, its family's
    arguments by the kernel's keywords (gamma (H,) or g (B, H, N); beta and g, ...) when it
    has them, output and exact (B, H, N, dv; exact in
    float64, NaN where it is 0/0), and the case, spec, dtype and implementation as strings;
    return a line saying what was written. An output the implementation does not give (an
    exception) is left out and named in `problem`."""
    q, k, v, w, decay = case_arguments(case, impl.spec)
    arrays = {"q": _array(q), "k": _array(k), "v": _array(v)}
    if w is not None:
        arrays["projection"] = _array(w)
    if decay is not None:  # its family's keywords: gamma or g, beta and g, a and b, ...
        keywords = family_of(impl.spec).keywords(impl.spec, decay, "bhnd")
        arrays |= {name: _array(t) for name, t in keywords.items()}
    arrays["exact"] = exact(validate(q, k, v, impl.spec, w, decay), impl.spec)
    try:
        arrays["output"] = _array(impl(q, k, v, w, decay))
        problem = ""
    except ImplementationFailure as err:
        problem = f"{impl.name} {err}"
    text = {
        "case": case.to_json(),
        "spec": str(impl.spec),
        "dtype": case.dtype,
        "implementation": impl.name,
        "problem": problem,
    }
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as file:  # a file object: np.savez adds no suffix to it
        np.savez(file, **arrays, **{key: np.array(value) for key, value in text.items()})
    os.replace(partial, path)
    return f"saved {', '.join(arrays)} to {path}" + (f" (no output: {problem})" if problem else "")
