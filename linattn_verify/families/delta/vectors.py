"""The delta rule's known-answer vectors (linattn_verify/known_answers/): the specs that have
them, fla's layers' DeltaNet, Gated DeltaNet, KDA and DeltaNet with q and k normalised in the
kernel (scale d^-0.5), in part 4 (Family.known_answer_specs), each vector's case, and what a
vector says of its spec."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...cases import Case
from ...specs import RSQRT_D, Spec
from .fields import DELTA_SOURCE, QK_L2NORM_EPS
from .inputs import DELTA_KINDS

_FLA = Spec("identity", causal=True, normalize=False, scale=RSQRT_D, delta_rule=True)
DELTA_KAT_SPECS = (
    _FLA,
    replace(_FLA, decay="gates"),
    replace(_FLA, decay="channel-gates"),
    replace(_FLA, qk_l2norm=True),
)
KNOWN_ANSWER_SPECS = tuple((4, spec) for spec in DELTA_KAT_SPECS)  # part 4, the last


def delta_vector_cases(spec: Spec) -> list[tuple[str, Case]]:
    """The vectors of a delta-rule spec (B = 1, H = 2, d = 4, dv = 3, N <= 16): N = 1, ragged
    N = 11, every dtype, the delta rule's stress kinds (inputs.DELTA_KINDS: beta next to 2, keys
    of norm 0.37 to 2.7, nearly parallel keys) and, gated, gates next to 1 (e^-(2^-22) a
    token) and next to 0 (about e^-20: the state erased in a token)."""
    shape = (1, 2, 16, 4, 3)
    cases = [
        ("n1-float32", Case(1, 2, 1, 4, 3, "float32", seed=1)),
        ("ragged-float32", Case(1, 2, 11, 4, 3, "float32", seed=2)),
        ("float16", Case(*shape, "float16", seed=3)),
        ("bfloat16", Case(*shape, "bfloat16", seed=4)),
        ("float64", Case(*shape, "float64", seed=5)),
    ]
    for seed, kind in enumerate(DELTA_KINDS, 6):
        cases.append((f"{kind}-float32", Case(*shape, "float32", kind, seed=seed)))
    if spec.gated:
        cases += [
            ("decay-near-one-float32", Case(*shape, "float32", seed=9, decay_rate=2.0**-22)),
            ("decay-near-zero-float32", Case(*shape, "float32", seed=10, decay_rate=20.0)),
        ]
    return cases


def vector_fields(spec: Spec) -> dict[str, Any]:
    """What a delta-rule vector and its manifest entry say besides map, causality, eps,
    normalisation, scale and decay."""
    return {"delta_rule": True, "qk_l2norm": spec.qk_l2norm}


def formulas(spec: Spec) -> dict[str, str]:
    """The vector's formula: DELTA_SOURCE (its gates' too), and the normalisation of q and k
    under qk_l2norm."""
    l2norm = f"; q and k first x / sqrt(|x|^2 + {QK_L2NORM_EPS:g})" * spec.qk_l2norm
    return {"formula": DELTA_SOURCE + l2norm}
