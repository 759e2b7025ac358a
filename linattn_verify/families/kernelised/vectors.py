"""Kernelised attention's known-answer vectors (linattn_verify/known_answers/): its maps'
plain specs, causal and not, and the denominator eps of shipped kernels; their cases are
known_answers/cases.py's (Family.known_answer_cases)."""

from __future__ import annotations

from ...specs import FEATURE_MAPS, RSQRT_D, Spec

# the maps with vectors of their plain specs (identity, added after them, has none yet)
MAPS = tuple(name for name, info in FEATURE_MAPS.items() if info.kernelised and name != "identity")
# the denominator eps of shipped kernels: 1e-6 (fast-transformers' elu, performer-pytorch's
# causal relu and FAVOR+, fla's based), and fla's linear attention (1e-10, scale d^-0.5)
EPS_SPECS = (
    Spec("elu", eps=1e-6),
    Spec("elu", causal=True, eps=1e-6),
    Spec("relu", causal=True, eps=1e-6),
    Spec("performer-positive", causal=True, eps=1e-6),
    Spec("taylor", causal=True, eps=1e-6),
    Spec("relu", causal=True, eps=1e-10, scale=RSQRT_D),
)
# (part, spec): the plain specs in part 1, the eps in part 3 (Family.known_answer_specs)
KNOWN_ANSWER_SPECS = tuple(
    (1, Spec(name, causal=causal)) for name in MAPS for causal in (False, True)
) + tuple((3, spec) for spec in EPS_SPECS)
