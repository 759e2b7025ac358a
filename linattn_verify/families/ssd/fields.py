"""The SSD layer's spec fields: their source, their options in the claim's grammar
(Family.options: the command line's --z-gate, --dt-softplus, --dt-min and --dt-max, and the
delta rule's --value-heads for C and B shared by groups of heads; pytest's and
assert_linear_attention's keywords of the same names, specs.Spec's fields) and their rules
(Family.check)."""

from __future__ import annotations

import math

from ...grammar import Option
from ...specs import Spec, SpecError
from ..delta.fields import VALUE_HEADS, check_value_heads

SSD_SOURCE = (
    "Mamba-2's SSD layer (Dao & Gu 2024, 'Transformers are SSMs: generalized models and "
    "efficient algorithms through structured state space duality', sec. 3-6 and 7 (the Mamba-2 "
    "block), as mamba_ssm 2.3's mamba_chunk_scan_combined computes it): dt_t = clamp(dt'_t + "
    "dt_bias, softplus'd with dt_softplus, to [dt_min, dt_max]), S_t = exp(dt_t A) S_(t-1) + "
    "dt_t B_t x_t^T, y_t = S_t^T C_t + D x_t, times silu(z_t) with z_gate"
)
# torch's F.softplus and mamba_ssm's kernels return s itself above this (bound.py)
SOFTPLUS_THRESHOLD = 20.0

OPTIONS = (
    Option("z_gate", "--z-gate", bool, False,
           "with --family ssd: fn also takes z=(B, H, N, dv) and gates its output, y * "
           "silu(z) (mamba_ssm's z)"),
    Option("dt_softplus", "--dt-softplus", bool, False,
           "with --family ssd: fn passes dt + dt_bias through softplus (mamba_ssm's "
           "dt_softplus=True)"),
    Option("dt_min", "--dt-min", float, 0.0,
           "with --family ssd: fn clamps dt below at this (mamba_ssm's dt_limit[0]; default 0)",
           metavar="LO"),
    Option("dt_max", "--dt-max", float, math.inf,
           "with --family ssd: fn clamps dt above at this (mamba_ssm's dt_limit[1]; default "
           "inf)", metavar="HI"),
    VALUE_HEADS,
)  # fmt: skip


def check(spec: Spec) -> None:
    """SpecError unless `spec` is the SSD layer's: causal, identity features, unnormalised,
    scale 1, no decay (its own is exp(dt A)), eps 0, 0 <= dt_min <= dt_max, value_heads an
    integer >= 1."""
    check_value_heads(spec)
    wrong = [
        what
        for what, bad in (
            ("causal", not spec.causal),
            ("the identity feature map", spec.feature_map != "identity"),
            ("unnormalised", spec.normalize),
            ("scale 1", spec.scale != 1.0),
            ("no decay (its own is exp(dt A))", spec.decay is not None),
            ("eps 0", spec.eps != 0),
            ("0 <= dt_min <= dt_max", not 0.0 <= spec.dt_min <= spec.dt_max),
        )
        if bad
    ]
    if wrong:
        raise SpecError(f"the SSD family takes {', '.join(wrong)}: not {spec}")
