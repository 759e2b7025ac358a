"""The IPLR family (families/iplr/): its references agree with each other and with a case
computed by hand, its forms and golden form stay within its a-priori bound where broken
evaluations do not, vet passes a correct kernel and rejects broken twins, and the registry
takes it by name only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn_verify.cases import Case
from linattn_verify.families import attention, attention_varlen, family_of, reference
from linattn_verify.families.delta.inputs import DELTA_KINDS
from linattn_verify.families.iplr.bound import iplr_scale_and_bound, iplr_state_bound
from linattn_verify.families.iplr.family import IPLR
from linattn_verify.families.iplr.forms import iplr_attention
from linattn_verify.families.iplr.golden import golden_iplr, golden_iplr_with_state
from linattn_verify.families.iplr.inputs import iplr_arguments, pack_iplr, validate_iplr
from linattn_verify.families.iplr.reference import (
    arb_iplr,
    exact_iplr_state,
    mp_iplr,
    transition_norms,
)
from linattn_verify.inputs import UNIT_ROUNDOFF
from linattn_verify.specs import Spec, SpecError
from linattn_verify.testing import assert_linear_attention

U64 = 2.0**-53  # float64's unit roundoff
SPEC = Spec("identity", causal=True, normalize=False, scale="d^-0.5", family="iplr")
F64 = {"dtype": torch.float64}


def _inputs(case: Case):
    """(q, k, v, packed a and b, validated float64 inputs) of a case."""
    q, k, v, _, packed = IPLR.case_arguments(case, SPEC)
    return q, k, v, packed, validate_iplr(q, k, v, SPEC, None, packed)


def _units(out: torch.Tensor, ref: np.ndarray, scale: np.ndarray, dtype: str) -> np.ndarray:
    return np.abs(out.double().numpy() - ref) / (UNIT_ROUNDOFF[dtype] * scale)


def test_the_registry_takes_iplr_by_name_and_a_spec_is_checked_by_it():
    assert family_of(SPEC) is IPLR
    assert family_of(Spec("identity", causal=True, normalize=False)) is not IPLR
    for bad in (
        {"feature_map": "identity", "causal": False, "normalize": False},
        {"feature_map": "identity", "causal": True, "normalize": True},
        {"feature_map": "elu", "causal": True, "normalize": False},
        {"feature_map": "identity", "causal": True, "normalize": False, "decay": "gates"},
    ):
        with pytest.raises(SpecError, match="IPLR family takes"):
            Spec(**bad, family="iplr")
    with pytest.raises(SpecError, match="unknown family"):
        Spec("identity", causal=True, normalize=False, family="iplr2")


def test_a_case_computed_by_hand():
    """d = 2, dv = 1, c = 1: S_1 = k_1 v_1 = (1, 0); a_2^T S_1 = 1, so S_2 = S_1 + b_2 + k_2
    v_2 = (1, 5); a_3^T S_2 = 5, S_3 = S_2 - 5 (1, 0) - (1, 1) = (-5, 4). o = q_t . S_t.
    With a and b swapped, o_2 would be 4 (b_2^T S_1 = 0)."""
    spec = Spec("identity", causal=True, normalize=False, scale=1.0, family="iplr")
    q = torch.tensor([[1.0, 1], [1, 1], [2, -1]], **F64).reshape(1, 1, 3, 2)
    k = torch.tensor([[1.0, 0], [0, 1], [1, 1]], **F64).reshape(1, 1, 3, 2)
    v = torch.tensor([1.0, 3, -1], **F64).reshape(1, 1, 3, 1)
    a = torch.tensor([[5.0, 7], [1, 0], [0, 1]], **F64).reshape(1, 1, 3, 2)
    b = torch.tensor([[3.0, -2], [0, 2], [-1, 0]], **F64).reshape(1, 1, 3, 2)
    x = validate_iplr(q, k, v, spec, None, pack_iplr(a, b))
    for engine in (mp_iplr, arb_iplr):
        out, state = engine(x, spec, state=True)
        assert out.ravel().tolist() == [1.0, 6.0, -14.0]
        assert state.ravel().tolist() == [-5.0, 4.0]
    assert reference(q, k, v, "identity", True, normalize=False, a=a, b=b, family="iplr").shape
    swapped = mp_iplr(validate_iplr(q, k, v, spec, None, pack_iplr(b, a)), spec)[0]
    assert swapped.ravel()[1] == 4.0


@pytest.mark.parametrize("seed", range(3))
def test_mpmath_and_arb_agree(seed: int):
    """Both within one ulp of the exact value (faithful and correct rounding), from an
    initial state, on typical and expanding inputs, outputs and final states."""
    kind = ("normal", "long-keys", "parallel-keys")[seed]
    _, _, _, _, x = _inputs(Case(2, 1, 6, 3, 2, "float32", kind=kind, seed=seed))
    s0 = np.random.default_rng(seed).standard_normal((2, 1, 3, 2))
    mp_out, mp_state = mp_iplr(x, SPEC, s0, state=True)
    arb_out, arb_state = arb_iplr(x, SPEC, s0, state=True)
    for got, want in ((mp_out, arb_out), (mp_state, arb_state)):
        assert np.all(np.abs(got - want) <= np.spacing(np.abs(want))), (got, want)


def test_the_reference_is_fla_s_naive_recurrence_in_float32():
    """fla's iplr_recurrence (adapter fla.iplr-naive) computes the same map: within the
    bound in float32 (a and b in fla's alpha and beta order)."""
    fla_naive = pytest.importorskip("linattn_verify.adapters.fla_iplr")
    naive = fla_naive.ADAPTERS[0].load()
    case = Case(2, 2, 40, 8, 4, "float32", seed=5)
    q, k, v, packed, x = _inputs(case)
    ref = IPLR.exact(x, SPEC, "arb")
    scale, bound = iplr_scale_and_bound(x, SPEC, ref, UNIT_ROUNDOFF["float32"])
    out = naive(q, k, v, **iplr_arguments(SPEC, packed))
    errors = _units(out, ref, scale, "float32")
    assert (errors <= bound).all() and errors.max() > 0


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("kind", ["normal", "mean-values", "outlier-channels", *DELTA_KINDS])
def test_forms_and_golden_are_within_the_bound(dtype: str, kind: str):
    case = Case(2, 2, 70, 8, 5, dtype, kind=kind, seed=11)
    q, k, v, packed, x = _inputs(case)
    ref = IPLR.exact(x, SPEC, "arb")
    scale, bound = iplr_scale_and_bound(x, SPEC, ref, UNIT_ROUNDOFF[dtype])
    given = iplr_arguments(SPEC, packed)
    outs = {form: attention(q, k, v, "identity", True, form, normalize=False, scale="d^-0.5",
                            chunk_size=16, family="iplr", **given)
            for form in IPLR.forms(SPEC)}  # fmt: skip
    outs["golden"] = golden_iplr(q, k, v, SPEC, None, "recurrent", packed)
    for name, out in outs.items():
        assert out.dtype == q.dtype
        errors = _units(out, ref, scale, dtype)
        assert (errors <= bound).all(), (name, float(np.max(errors / bound)))


def test_the_final_state_is_within_its_bound():
    case = Case(2, 2, 50, 8, 3, "float32", seed=3)
    q, k, v, packed, x = _inputs(case)
    _, exact = exact_iplr_state(x, SPEC)
    bound = iplr_state_bound(x, SPEC, UNIT_ROUNDOFF["float32"])
    given = iplr_arguments(SPEC, packed)
    for form in IPLR.forms(SPEC):
        _, state = iplr_attention(q, k, v, SPEC, form, given["a"], given["b"], 16)
        assert (np.abs(state.double().numpy() - exact) <= bound).all(), form
    _, state = golden_iplr_with_state(q, k, v, SPEC, packed)
    assert (np.abs(state.double().numpy() - exact) <= bound).all()


def _broken(q, k, v, a, b, late: bool) -> torch.Tensor:
    """The recurrence in float32 with a and b swapped, or (late) the low-rank term taken from
    S_t instead of S_(t-1) (S <- S + k v^T first, then b a^T S)."""
    if not late:
        a, b = b, a
    q, k, v, a, b = (t.float() for t in (q, k, v, a, b))
    state = torch.zeros(*q.shape[:2], q.shape[-1], v.shape[-1])
    rows = []
    for t in range(q.shape[2]):
        injected = k[:, :, t, :, None] * v[:, :, t, None, :]
        base = state + injected if late else state
        state = base + b[:, :, t, :, None] * (a[:, :, t, None, :] @ base)
        state = state if late else state + injected
        rows.append((q[:, :, t, None, :] @ state)[:, :, 0] * q.shape[-1] ** -0.5)
    return torch.stack(rows, 2).to(q.dtype)


@pytest.mark.parametrize("late", [False, True])
def test_a_broken_evaluation_exceeds_the_bound(late: bool):
    case = Case(2, 2, 40, 8, 4, "float32", seed=7)
    q, k, v, packed, x = _inputs(case)
    ref = IPLR.exact(x, SPEC, "arb")
    scale, bound = iplr_scale_and_bound(x, SPEC, ref, UNIT_ROUNDOFF["float32"])
    out = _broken(q, k, v, **iplr_arguments(SPEC, packed), late=late)
    assert (_units(out, ref, scale, "float32") > bound).any()


def test_packed_sequences_and_a_carried_state_are_each_sequence_by_itself():
    gen = torch.Generator().manual_seed(2)
    q, k, a, b = (torch.randn(1, 2, 13, 4, generator=gen, **F64) / 2 for _ in range(4))
    v = torch.randn(1, 2, 13, 3, generator=gen, **F64)
    cu = torch.tensor([0, 5, 5, 13])
    options = {"feature_map": "identity", "causal": True, "normalize": False}
    options |= {"scale": "d^-0.5", "family": "iplr"}
    for form in IPLR.forms(SPEC):
        packed = attention_varlen(q, k, v, cu, form=form, chunk_size=3, a=a, b=b, **options)
        head, state = iplr_attention(*(t[:, :, :5] for t in (q, k, v)), SPEC, form,
                                     a[:, :, :5], b[:, :, :5], 3)  # fmt: skip
        tail, _ = iplr_attention(*(t[:, :, 5:] for t in (q, k, v)), SPEC, form,
                                 a[:, :, 5:], b[:, :, 5:], 3, initial_state=state)  # fmt: skip
        whole, _ = iplr_attention(q, k, v, SPEC, form, a, b, 3)
        assert torch.equal(packed[:, :, :5], head)  # the same operations on the same tokens
        assert not torch.allclose(packed[:, :, 5:], tail)  # its own start, not the carried state
        x = validate_iplr(q, k, v, SPEC, None, pack_iplr(a, b))
        exact = IPLR.exact(x, SPEC, "arb")
        scale, bound = IPLR.scale_and_bound(x, SPEC, exact, U64, 0.0)
        for got in (torch.cat([head, tail], 2), whole):  # float64, within its a-priori bound
            assert (np.abs(got.numpy() - exact) <= bound * U64 * scale).all(), form


def test_transition_norms_are_the_two_norm():
    gen = np.random.default_rng(0)
    a, b = gen.standard_normal((2, 50, 5))
    exact = [np.linalg.norm(np.eye(5) + np.outer(bt, at), 2) for at, bt in zip(a, b)]
    assert np.allclose(transition_norms(a, b), exact, rtol=1e-12)
    unit = a[0] / np.linalg.norm(a[0])
    assert transition_norms(-unit, 0.7 * unit) == pytest.approx(1.0, abs=1e-15)


def _kernel(late: bool | None):
    """A kernel of the contract: the correct recurrence (None) or a broken twin."""

    def fn(q, k, v, a, b):
        if late is None:
            return iplr_attention(q, k, v, SPEC, "recurrent", a, b)[0]
        return _broken(q, k, v, a, b, late)

    return fn


OPTIONS = {"causal": True, "normalize": False, "scale": "d^-0.5", "family": "iplr"}


def test_vet_passes_the_recurrence():
    assert_linear_attention(_kernel(None), "identity", smallest=True, **OPTIONS)


@pytest.mark.parametrize("late", [False, True])
def test_vet_rejects_a_broken_twin(late: bool):
    with pytest.raises(AssertionError, match=r"wrong on typical inputs, .*: .*accuracy float32"):
        assert_linear_attention(_kernel(late), "identity", smallest=True, **OPTIONS)


def test_the_certified_engine_is_arb_s_and_gradients_are_refused():
    _, _, _, _, x = _inputs(Case(1, 2, 5, 3, 2, "float32", seed=4))
    certified = IPLR.certified(x, SPEC, None)
    assert np.array_equal(certified.values, IPLR.exact(x, SPEC, "arb"))
    assert np.array_equal(IPLR.exact(x, SPEC, "certified"), certified.values)
    assert (certified.bound <= np.spacing(np.abs(certified.values))).all()
    assert (certified.scale > 0).all()
    with pytest.raises(SpecError, match="no exact gradients"):
        IPLR.exact_gradients(x, SPEC, np.ones(x.v.shape))
