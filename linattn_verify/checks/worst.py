"""The worst element of a failed judgement, for a person investigating it: its output, its
exact value and their relative difference; for a small case also the rows it is computed
from (q_i, the keys and values it attends to), so that it can be recomputed by hand."""

from __future__ import annotations

import numpy as np
import torch

from ..accuracy.verdict import percent

# a case is shown with its rows when it has at most this many tokens and features
SMALL_N = 16
SMALL_D = 8


def _row(values: torch.Tensor) -> str:
    return "[" + ", ".join(f"{float(x):.6g}" for x in values.reshape(-1)) + "]"


def _relative(out: float, exact: float) -> str:
    if np.isnan(exact):
        return "the exact value is 0/0 (the output must be NaN)"
    if out == exact:
        return "|output - exact| / |exact| = 0"
    if exact == 0 or not np.isfinite(out):
        return "|output - exact| / |exact| infinite"
    return f"|output - exact| / |exact| = {percent(abs(out - exact) / abs(exact))}"


def worst_element(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: np.ndarray,
    exact: np.ndarray,
    index: tuple[int, ...],
    causal: bool,
) -> str:
    """Lines describing out[index] against exact[index] (index = (b, h, i, c) and the
    tensors in the (B, H, N, d) layout, whatever the kernel's); the inputs it depends on
    when the case is small."""
    b, h, i, c = index
    got, want = float(out[index]), float(exact[index])
    lines = [
        f"worst element (b, h, i, c) = {tuple(index)}: output {got:.9g}, exact {want:.9g}; "
        + _relative(got, want)
    ]
    n, d, dv = q.shape[2], q.shape[3], v.shape[3]
    if n <= SMALL_N and max(d, dv) <= SMALL_D:
        keys = range(i + 1) if causal else range(n)
        last = keys[-1]
        lines.append(f"  q[{b}, {h}, {i}] = {_row(q[b, h, i])}")
        lines += [
            f"  j = {j:>2}: k[{b}, {h}, {j}] = {_row(k[b, h, j])}, v[{b}, {h}, {j}, {c}] = "
            f"{float(v[b, h, j, c]):.6g}"
            for j in keys
        ]
        lines.append(
            f"  (keys j = 0 .. {last}; the whole case: check ... --case JSON --save FILE.npz)"
        )
    return "\n".join(lines)
