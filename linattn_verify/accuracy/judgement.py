"""One input judged: its exact reference and the golden outputs that set the budget,
computed once, for every output to be judged on it (accuracy/verdict.py's judge)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..cases import Case
from ..families import case_arguments, exact, golden_attention, golden_forms, validate
from ..inputs import AttentionInputs, round_to_tf32
from ..specs import Spec
from .bound import FEATURE_MODEL
from .verdict import AccuracyVerdict, bound_of, judge


@dataclass
class Judgement:
    """The inputs (exact float64 copies), the exact output, the golden forms' outputs in
    the inputs' dtype (float32 under TF32 products: on q, k, v rounded to TF32, what a
    careful TF32 kernel attains), and the bound per dtype once computed."""

    x: AttentionInputs
    spec: Spec
    ref: np.ndarray
    golden: list[torch.Tensor]
    bounds: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, q, k, v, w, spec: Spec, decay=None) -> Judgement:
        """Judgement of the tensors q, k, v (and W, and the decay) as given, for `spec`."""
        x = validate(q, k, v, spec, w, decay)
        forms = golden_forms(spec)
        if spec.dot_precision == "tf32" and q.dtype == torch.float32:
            q, k, v = (round_to_tf32(t) for t in (q, k, v))  # the products' own inputs
        golden = [golden_attention(q, k, v, spec, w, form, decay) for form in forms]
        return cls(x, spec, exact(x, spec), golden)

    @classmethod
    def of_case(cls, case: Case, spec: Spec) -> Judgement:
        """Judgement of the case's tensors and decay, kept for the next call with the same
        case, spec and feature model (a search and vet's accuracy task meet the same cases,
        and the zoo's kernels of one spec do; callers must not modify its arrays)."""
        return _of_case(case, spec, FEATURE_MODEL.get())

    def bound(self, dtype: str) -> tuple[np.ndarray, np.ndarray]:
        """(s, bound) of outputs in `dtype`: the scale and the a-priori bound in units of u s
        that judge holds them to, per element."""
        return bound_of(self.x, self.spec, self.ref, dtype, self.bounds)

    def __call__(self, out: Any) -> AccuracyVerdict:
        """Judge `out`: bound, and budget K_BUDGET times the worst golden form's error."""
        return judge(out, self.x, self.spec, self.ref, self.golden, self.bounds)


@functools.lru_cache(maxsize=256)
def _of_case(case: Case, spec: Spec, feature_model: str) -> Judgement:
    """Judgement.of_case; feature_model is part of the key (the bound depends on it)."""
    q, k, v, w, decay = case_arguments(case, spec)
    return Judgement.of(q, k, v, w, spec, decay)
