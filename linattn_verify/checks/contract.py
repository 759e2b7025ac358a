"""The calling contract (docs/contract.md): output (B, H, N, dv), the inputs' dtype and device, and
the inputs left as they were."""

from __future__ import annotations

import torch

from ..cases import Case
from ..under_test import Implementation
from .core import Outcome, check, inputs_of


@check("contract")
def contract(impl: Implementation, case: Case) -> Outcome:
    """Shape, dtype and device of the output; inputs not modified in place."""
    (q, k, v, w, decay), _ = inputs_of(case, impl.spec)
    native = [impl.to_layout(t).contiguous() for t in (q, k, v)]
    before = [t.clone() for t in native]
    out = impl.call_raw(*native, w, decay)
    want = tuple(impl.to_layout(torch.empty(*q.shape[:3], v.shape[-1], device="meta")).shape)
    problems = []  # the output's own, then the inputs'
    if tuple(out.shape) != want:
        shape = tuple(out.shape)
        problems.append(
            f"shape {shape}, expected {want} ({impl.layout})" + impl.layout_hint(shape, want)
        )
    if out.dtype != q.dtype:
        problems.append(f"dtype {out.dtype}, expected {q.dtype}")
    if out.device != q.device:
        problems.append(f"device {out.device}, expected {q.device}")
    # an output of another shape, dtype or device: no check can judge its values as claimed
    unjudged = float(bool(problems))
    for name, old, new in zip("qkv", before, native):
        if not torch.equal(old, new):
            problems.append(f"input {name} was modified in place")
    if problems:
        return Outcome(False, "; ".join(problems), figures={"output_unjudged": unjudged})
    return Outcome(True, f"output {want} ({impl.layout}) {q.dtype} on {q.device}; inputs untouched")
