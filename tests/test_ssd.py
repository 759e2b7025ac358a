"""The SSD family (families/ssd/): its references agree with each other and with a case
computed by hand, its forms and golden form stay within its a-priori bound where broken
evaluations do not, groups of heads, packed sequences and a carried state are what the
equations say, and the registry takes it by name only."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from linattn_verify.cases import Case
from linattn_verify.families import attention_varlen, family_of
from linattn_verify.families.ssd.bound import ssd_state_bound
from linattn_verify.families.ssd.family import SSD
from linattn_verify.families.ssd.forms import ssd_attention
from linattn_verify.families.ssd.golden import golden_ssd, golden_ssd_with_state
from linattn_verify.families.ssd.inputs import pack_ssd, ssd_arguments, validate_ssd
from linattn_verify.families.ssd.reference import arb_ssd, exact_ssd_state, mp_ssd
from linattn_verify.inputs import UNIT_ROUNDOFF
from linattn_verify.specs import Spec, SpecError

U64 = 2.0**-53  # float64's unit roundoff
SPEC = Spec("identity", causal=True, normalize=False, family="ssd")
MAMBA = replace(SPEC, z_gate=True, dt_softplus=True)  # mamba_ssm's usual call
PLAIN = replace(SPEC, dt_min=0.002, dt_max=0.05)
F64 = {"dtype": torch.float64}


def _inputs(case: Case, spec: Spec):
    """(C, B, x, the pack, validated float64 inputs) of a case."""
    q, k, v, _, packed = SSD.case_arguments(case, spec)
    return q, k, v, packed, validate_ssd(q, k, v, spec, None, packed)


def _units(out: torch.Tensor, ref: np.ndarray, scale: np.ndarray, dtype: str) -> np.ndarray:
    return np.abs(out.double().numpy() - ref) / (UNIT_ROUNDOFF[dtype] * scale)


def test_the_registry_takes_ssd_by_name_and_a_spec_is_checked_by_it():
    assert family_of(MAMBA) is SSD and family_of(PLAIN) is SSD
    assert family_of(Spec("identity", causal=True, normalize=False)) is not SSD
    for bad in (
        {"causal": False},
        {"normalize": True},
        {"scale": 2.0},
        {"decay": "gates"},
        {"dt_min": 0.5, "dt_max": 0.1},
    ):
        with pytest.raises(SpecError, match="SSD family takes"):
            Spec(**{"feature_map": "identity", "causal": True, "normalize": False} | bad,
                 family="ssd")  # fmt: skip
    with pytest.raises(SpecError, match=r"z_gate \(--z-gate\) is for the SSD layer"):
        Spec("identity", causal=True, normalize=False, z_gate=True)
    with pytest.raises(SpecError, match="is for the SSD layer"):
        Spec("identity", causal=True, normalize=False, dt_softplus=True, family="iplr")


def test_a_case_computed_by_hand():
    """d = dv = 1, A = 0 (no decay), dt' = (0.5, 3), dt_bias 0.25, dt clamped to [0, 2]: dt =
    (0.75, 2); S_1 = 0.75 * 1 * 4 = 3, y_1 = 1 * 3 + 0.5 * 4 = 5; S_2 = 3 + 2 * 2 * 1 = 7,
    y_2 = 3 * 7 + 0.5 * 1 = 21.5. Without the clamp (dt_2 = 3.25) y_2 = 3 * 9.5 + 0.5 = 29."""
    spec = replace(SPEC, dt_max=2.0)
    c, b, x = (torch.tensor(t, **F64).reshape(1, 1, 2, 1) for t in ([1, 3], [1, 2], [4, 1]))
    packed = pack_ssd(torch.tensor([[[0.5, 3.0]]], **F64), *(torch.tensor([t], **F64)
                      for t in (0.0, 0.5, 0.25)))  # fmt: skip
    for engine in (mp_ssd, arb_ssd):
        out, state = engine(validate_ssd(c, b, x, spec, None, packed), spec, state=True)
        assert out.ravel().tolist() == [5.0, 21.5] and state.ravel().tolist() == [7.0]
    unclamped = arb_ssd(validate_ssd(c, b, x, SPEC, None, packed), SPEC)[0]
    assert unclamped.ravel().tolist() == [5.0, 29.0]
    for form in SSD.forms(spec):
        assert ssd_attention(c, b, x, spec, form, packed, 1)[0].ravel().tolist() == [5.0, 21.5]


@pytest.mark.parametrize("spec", [MAMBA, PLAIN], ids=["mamba", "plain"])
def test_mpmath_and_arb_agree(spec: Spec):
    """Both within one ulp of the exact value (faithful and correct rounding), from an
    initial state, outputs and final states: the dual form and the recurrence."""
    _, _, _, _, x = _inputs(Case(2, 2, 7, 3, 2, "float32", seed=3), spec)
    s0 = np.random.default_rng(3).standard_normal((2, 2, 3, 2))
    mp_out, mp_state = mp_ssd(x, spec, s0, state=True)
    arb_out, arb_state = arb_ssd(x, spec, s0, state=True)
    for got, want in ((mp_out, arb_out), (mp_state, arb_state)):
        assert np.all(np.abs(got - want) <= np.spacing(np.abs(want))), (got, want)


def _outputs(q, k, v, packed, spec: Spec) -> dict[str, torch.Tensor]:
    """Every built-in form's output (chunks of 16) and the golden one."""
    outs = {form: ssd_attention(q, k, v, spec, form, packed, 16)[0] for form in SSD.forms(spec)}
    outs["golden"] = golden_ssd(q, k, v, spec, None, "recurrent", packed)
    return outs


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("spec", [MAMBA, PLAIN], ids=["mamba", "plain"])
def test_forms_and_golden_are_within_the_bound(dtype: str, spec: Spec):
    case = Case(2, 2, 70, 8, 5, dtype, seed=11)
    q, k, v, packed, x = _inputs(case, spec)
    ref = SSD.exact(x, spec, "arb")
    scale, bound = SSD.scale_and_bound(x, spec, ref, UNIT_ROUNDOFF[dtype], 0.0)
    for name, out in _outputs(q, k, v, packed, spec).items():
        assert out.dtype == q.dtype
        errors = _units(out, ref, scale, dtype)
        assert (errors <= bound).all(), (name, float(np.max(errors / bound)))


def test_the_final_state_is_within_its_bound():
    case = Case(2, 2, 50, 8, 3, "float32", seed=3)
    q, k, v, packed, x = _inputs(case, MAMBA)
    _, exact = exact_ssd_state(x, MAMBA)
    bound = ssd_state_bound(x, MAMBA, UNIT_ROUNDOFF["float32"])
    for form in SSD.forms(MAMBA):
        _, state = ssd_attention(q, k, v, MAMBA, form, packed, 16)
        assert (np.abs(state.double().numpy() - exact) <= bound).all(), form
    _, state = golden_ssd_with_state(q, k, v, MAMBA, packed)
    assert (np.abs(state.double().numpy() - exact) <= bound).all()


def _broken(q, k, v, given: dict, flaw: str) -> torch.Tensor:
    """The recurrence in float64 with one flaw: dt on B and on x, D x after the gate, the
    clamp or the softplus or the gate left out."""
    dt = given["dt"] + given["dt_bias"][:, None]
    dt = dt if flaw == "no-softplus" else torch.nn.functional.softplus(dt)
    dt = dt if flaw == "no-clamp" else dt.clamp(0.002, 0.05)
    state = torch.zeros(*v.shape[:2], q.shape[-1], v.shape[-1], **F64)
    rows = []
    for t in range(v.shape[2]):
        step = dt[:, :, t, None, None]
        key = k[:, :, t, :, None] * (step if flaw == "dt-twice" else 1)
        state = torch.exp(step * given["A"][:, None, None]) * state + key * step * v[:, :, t, None]
        rows.append((q[:, :, t, None, :] @ state)[:, :, 0])
    y, skip = torch.stack(rows, 2), given["D"][:, None, None] * v
    gate = 1 if flaw == "no-gate" else torch.nn.functional.silu(given["z"])
    return y * gate + skip if flaw == "skip-after-gate" else (y + skip) * gate


@pytest.mark.parametrize("flaw", ["dt-twice", "skip-after-gate", "no-softplus", "no-clamp",
                                  "no-gate"])  # fmt: skip
def test_a_broken_evaluation_exceeds_the_bound(flaw: str):
    """Each extra judged exactly: a kernel that leaves one out is outside the float64 bound."""
    spec = replace(MAMBA, dt_min=0.002, dt_max=0.05)
    q, k, v, packed, x = _inputs(Case(2, 2, 40, 8, 4, "float64", seed=7), spec)
    ref = SSD.exact(x, spec, "arb")
    scale, bound = SSD.scale_and_bound(x, spec, ref, U64, 0.0)
    out = _broken(q, k, v, ssd_arguments(spec, packed), flaw)
    assert (_units(out, ref, scale, "float64") > bound).any()
    assert (_units(_broken(q, k, v, ssd_arguments(spec, packed), ""), ref, scale, "float64")
            <= bound).all()  # fmt: skip


def test_groups_of_heads_share_c_and_b():
    """C and B of G = 2 groups for H = 4 heads: head h reads group h // 2, as the same inputs
    with C and B repeated; the references see the same."""
    q, k, v, packed, _ = _inputs(Case(1, 4, 20, 4, 3, "float64", seed=5), MAMBA)
    c, b = q[:, ::2], k[:, ::2]
    wide = (t.repeat_interleave(2, 1) for t in (c, b))
    x = validate_ssd(c, b, v, MAMBA, None, packed)
    assert np.array_equal(x.q, validate_ssd(*wide, v, MAMBA, None, packed).q)
    for form in SSD.forms(MAMBA):
        grouped = ssd_attention(c, b, v, MAMBA, form, packed, 8)[0]
        assert torch.equal(grouped, ssd_attention(*(t.repeat_interleave(2, 1) for t in (c, b)),
                                                  v, MAMBA, form, packed, 8)[0])  # fmt: skip
        given = ssd_arguments(MAMBA, packed)  # the family's entry point takes groups too
        assert torch.equal(grouped, SSD.attention(c, b, v, MAMBA, form, None, 8, given))
    with pytest.raises(SpecError, match="G heads dividing"):
        ssd_attention(q[:, :3], k[:, :3], v, MAMBA, "recurrent", packed)


def test_packed_sequences_and_a_carried_state_are_each_sequence_by_itself():
    q, k, v, packed, _ = _inputs(Case(1, 2, 13, 4, 3, "float64", seed=2), MAMBA)
    cu = torch.tensor([0, 5, 5, 13])
    given = ssd_arguments(MAMBA, packed)
    for form in SSD.forms(MAMBA):
        joined = attention_varlen(q, k, v, cu, spec=MAMBA, form=form, chunk_size=3, **given)
        head, state = ssd_attention(*(t[:, :, :5] for t in (q, k, v)), MAMBA, form,
                                    packed[:, :, :5], 3)  # fmt: skip
        tail, _ = ssd_attention(*(t[:, :, 5:] for t in (q, k, v)), MAMBA, form,
                                packed[:, :, 5:], 3, initial_state=state)  # fmt: skip
        whole, _ = ssd_attention(q, k, v, MAMBA, form, packed, 3)
        assert torch.equal(joined[:, :, :5], head)
        assert not torch.allclose(joined[:, :, 5:], tail)  # its own start, not the carried one
        x = validate_ssd(q, k, v, MAMBA, None, packed)
        exact = SSD.exact(x, MAMBA, "arb")
        scale, bound = SSD.scale_and_bound(x, MAMBA, exact, U64, 0.0)
        for got in (torch.cat([head, tail], 2), whole):  # float64, within its a-priori bound
            assert (np.abs(got.numpy() - exact) <= bound * U64 * scale).all(), form


def test_a_pack_whose_head_parameters_vary_is_refused():
    q, k, v, packed, _ = _inputs(Case(1, 2, 6, 3, 2, "float32", seed=1), MAMBA)
    varied = packed.clone()
    varied[0, 0, 3, 1] += 1  # A of head 0 at token 3
    with pytest.raises(SpecError, match="vary over batch or tokens"):
        validate_ssd(q, k, v, MAMBA, None, varied)
    with pytest.raises(SpecError, match="packed"):
        validate_ssd(q, k, v, SPEC, None, packed)  # z given to a spec without the gate


def test_the_certified_engine_is_arb_s_and_gradients_are_refused():
    _, _, _, _, x = _inputs(Case(1, 2, 5, 3, 2, "float32", seed=4), MAMBA)
    certified = SSD.certified(x, MAMBA, None)
    assert np.array_equal(certified.values, SSD.exact(x, MAMBA, "arb"))
    assert (certified.bound <= np.spacing(np.abs(certified.values))).all()
    assert (certified.scale > 0).all()
    with pytest.raises(SpecError, match="no exact gradients"):
        SSD.exact_gradients(x, MAMBA, np.ones(x.v.shape))
