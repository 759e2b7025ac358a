"""The delta rule's a-priori bound (families/delta/bound.py) against the exact references: the
built-in forms and the golden recurrence, in float16 and float32, on typical and adversarial
inputs (beta near 2, keys far from unit norm, nearly parallel keys: the UT transform's
ill-conditioned case), never err by more than it allows, outputs and final states alike;
and it is not vacuous (under one unit of the output's scale on typical inputs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn_verify.accuracy.bound import scale_and_bound
from linattn_verify.accuracy.state_bounds import state_bound
from linattn_verify.accuracy.verdict import error_units
from linattn_verify.cases import Case
from linattn_verify.families import case_arguments, exact, exact_state, golden_attention, validate
from linattn_verify.families.delta.fields import DELTA_DECAYS
from linattn_verify.families.delta.forms import delta_attention
from linattn_verify.families.delta.inputs import DELTA_KINDS, delta_arguments
from linattn_verify.inputs import UNIT_ROUNDOFF
from linattn_verify.specs import RSQRT_D, Spec

KINDS = ("normal", *DELTA_KINDS)
L2NORM = "l2norm"  # DeltaNet with q and k normalised inside


def _spec(decay: str | None) -> Spec:
    l2norm = decay == L2NORM
    decay = None if l2norm else decay
    return Spec("identity", True, normalize=False, scale=RSQRT_D, decay=decay, delta_rule=True,
                qk_l2norm=l2norm)  # fmt: skip


def _judged(case: Case, spec: Spec) -> None:
    """Every built-in evaluation of `case` (the golden recurrence, the recurrent and chunked
    forms, chunks of 16 and 64) within the bound."""
    q, k, v, _, packed = case_arguments(case, spec)
    x = validate(q, k, v, spec, None, packed)
    ref = exact(x, spec)
    u = UNIT_ROUNDOFF[case.dtype]
    scale, bound = scale_and_bound(x, spec, ref, u)
    given = delta_arguments(spec, packed)
    outputs = {"golden": golden_attention(q, k, v, spec, None, "recurrent", packed)}
    for form in ("recurrent", "chunked"):
        for chunk in (16, 64):
            out, _ = delta_attention(q, k, v, spec, form, chunk_size=chunk, **given)
            outputs[f"{form} {chunk}"] = out
    for name, out in outputs.items():
        e = error_units(out.double().numpy(), ref, scale, u)
        assert np.all(e <= bound), (name, float(np.max(e / bound)))


@pytest.mark.parametrize("decay", [*DELTA_DECAYS, L2NORM])
@pytest.mark.parametrize(
    ("kind", "dtype"),
    [*((kind, "float32") for kind in KINDS), ("normal", "float16"), ("normal", "bfloat16")],
)
def test_no_evaluation_exceeds_the_bound(decay, kind, dtype):
    """float32 on every kind (the forms compute half inputs in float32 too, the bound is
    tightest there), the half dtypes on typical inputs."""
    _judged(Case(1, 2, 70, 4, 3, dtype, kind, seed=3), _spec(decay))


@pytest.mark.parametrize("decay", ["gates", "channel-gates"])
@pytest.mark.parametrize("rate", [1.0, 8.0, 20.0])
@pytest.mark.parametrize("dtype", ["float32"])
def test_strong_gates_stay_within_the_bound(decay, rate, dtype):
    """Gates of e^-1 to e^-20 a token: prefix sums over a chunk in the tens to thousands."""
    _judged(Case(1, 2, 70, 4, 3, dtype, seed=4, decay_rate=rate), _spec(decay))


def test_an_underflowing_gate_leaves_the_bound_finite():
    """A log-gate of -800 (exp(g) is 0 in float64) erases the state: the tokens after it are
    judged as a fresh start, not left unbounded."""
    spec = _spec("gates")
    q, k, v, _, packed = case_arguments(Case(1, 1, 12, 4, 3, "float32", seed=6), spec)
    packed[:, :, 3, 1] = -800.0
    x = validate(q, k, v, spec, None, packed)
    assert np.all(np.isfinite(scale_and_bound(x, spec, None, 2.0**-24)[1]))


@pytest.mark.parametrize("decay", DELTA_DECAYS)
@pytest.mark.parametrize("kind", KINDS)
def test_the_final_state_is_within_the_state_bound(decay, kind):
    spec = _spec(decay)
    q, k, v, _, packed = case_arguments(Case(1, 2, 70, 4, 3, "float32", kind, seed=5), spec)
    x = validate(q, k, v, spec, None, packed)
    want = exact_state(x, spec)[0]
    allowed = state_bound(x, spec, UNIT_ROUNDOFF["float32"])[0]
    for form in ("recurrent", "chunked"):
        _, s = delta_attention(q, k, v, spec, form, **delta_arguments(spec, packed))
        assert np.all(np.abs(s.double().numpy() - want) <= allowed), form


@pytest.mark.parametrize("decay", DELTA_DECAYS)
def test_the_bound_is_not_vacuous_on_typical_inputs(decay):
    """Below the output's scale (bound u < 1): the bound says something about float32
    outputs, where a componentwise one (|A_t| up to 1 + beta a step) would allow 10^30."""
    spec = _spec(decay)
    q, k, v, _, packed = case_arguments(Case(1, 1, 256, 16, 4, "float32", seed=1), spec)
    _, bound = scale_and_bound(validate(q, k, v, spec, None, packed), spec, None, 2.0**-24)
    assert np.max(bound) * 2.0**-24 < 1


def test_a_wrong_output_exceeds_the_bound():
    """beta applied to v_t alone (u_t = beta v_t - S^T k_t), the zoo's first delta-rule bug,
    is far outside the bound in float32."""
    spec = _spec(None)
    q, k, v, _, packed = case_arguments(Case(1, 2, 40, 4, 3, "float32", seed=2), spec)
    x = validate(q, k, v, spec, None, packed)
    ref, beta = exact(x, spec), delta_arguments(spec, packed)["beta"].double()
    s = torch.zeros(1, 2, 4, 3, dtype=torch.float64)
    out = torch.empty(1, 2, 40, 3, dtype=torch.float64)
    for t in range(40):
        kt = k[:, :, t].double()
        u_t = beta[:, :, t, None] * v[:, :, t].double() - torch.einsum("bhd,bhdc->bhc", kt, s)
        s = s + kt[..., None] * u_t[:, :, None, :]
        out[:, :, t] = torch.einsum("bhd,bhdc->bhc", q[:, :, t].double(), s) / 2
    scale, bound = scale_and_bound(x, spec, ref, 2.0**-24)
    assert np.max(error_units(out.numpy(), ref, scale, 2.0**-24) / bound) > 100
