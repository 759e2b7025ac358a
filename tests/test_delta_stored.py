"""The delta rule's golden under Spec.stored (golden.py's golden_delta_stored): its chunked
form is the recurrence, and under 16-bit inputs it rounds what a chunk kernel stores, values
and cotangents, and only where declared."""

from __future__ import annotations

import pytest
import torch

from linattn_verify.accuracy.judgement import Judgement
from linattn_verify.cases import Case
from linattn_verify.checks import ALL_CHECKS
from linattn_verify.families.delta.golden import (
    STORED_CHUNK,
    _Stored,
    golden_delta_stored,
    golden_delta_with_state,
)
from linattn_verify.families.delta.inputs import pack_delta
from linattn_verify.specs import RSQRT_D, Spec, SpecError
from linattn_verify.under_test import resolve
from linattn_verify.vet.causes import STORED, name_cause
from tests.zoo.delta import ENTRIES as FORWARDS
from tests.zoo.delta_backward import ENTRIES as BACKWARDS

N = 2 * STORED_CHUNK + 5  # three chunks, the last ragged


def _spec(decay, l2norm=False, stored=None) -> Spec:
    return Spec("identity", True, normalize=False, scale=RSQRT_D, decay=decay, delta_rule=True,
                qk_l2norm=l2norm, stored=stored)  # fmt: skip


def _inputs(decay, l2norm, dtype, seed=0, d=4, dv=3):
    """q, k, v in `dtype` and the packed beta and gates (1, 1, N): unit keys unless
    normalised inside, beta in (0, 1), gates in [-0.5, 0]."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, N, d, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 1, N, d, generator=gen, dtype=torch.float64)
    k = k if l2norm else k / k.norm(dim=-1, keepdim=True)
    v = torch.randn(1, 1, N, dv, generator=gen, dtype=torch.float64)
    beta = torch.rand(1, 1, N, generator=gen, dtype=torch.float64)
    g = None
    if decay is not None:
        shape = (1, 1, N) + ((d,) if decay == "channel-gates" else ())
        g = -0.5 * torch.rand(*shape, generator=gen, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype), pack_delta(beta, g)


@pytest.mark.parametrize("l2norm", [False, True], ids=["unit-k", "l2norm"])
@pytest.mark.parametrize("decay", [None, "gates", "channel-gates"])
def test_the_chunked_form_is_the_recurrence_within_its_float64_bound(decay, l2norm):
    q, k, v, packed = _inputs(decay, l2norm, torch.float64)
    spec = _spec(decay, l2norm)
    out, _ = golden_delta_stored(q, k, v, spec, packed)
    verdict = Judgement.of(q, k, v, None, spec, packed)(out)
    assert verdict.within_bound, verdict.message


@pytest.mark.parametrize("decay", [None, "gates"])
def test_a_carried_state_continues_the_chunks(decay):
    q, k, v, packed = _inputs(decay, False, torch.float64, seed=1)
    spec = _spec(decay)
    s0 = torch.randn(1, 1, 4, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    out, state = golden_delta_stored(q, k, v, spec, packed, s0)
    want, want_state = golden_delta_with_state(q, k, v, spec, packed, s0)
    # two float64 evaluations of one recurrence: each a few hundred roundings of O(1) terms
    allowed = N * 4 * torch.finfo(torch.float64).eps * (1 + want.abs().max())
    assert (out - want).abs().max() <= allowed
    assert (state - want_state).abs().max() <= allowed


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_declared_16_bit_goldens_round_the_stores_and_float32_is_untouched(dtype):
    q, k, v, packed = _inputs("gates", False, dtype, seed=3)
    plain, stored = _spec("gates"), _spec("gates", stored="input-dtype")
    rounded = Judgement.of(q, k, v, None, stored, packed)
    careful = Judgement.of(q, k, v, None, plain, packed)
    assert not torch.equal(rounded.golden[0], careful.golden[0])
    assert rounded(rounded.golden[0]).within_bound  # the design is sane: inside the bound
    q32, k32, v32 = (t.float() for t in (q, k, v))
    a = golden_delta_with_state(q32, k32, v32, stored, packed.float())[0]
    assert torch.equal(a, golden_delta_with_state(q32, k32, v32, plain, packed.float())[0])


@pytest.mark.parametrize("cotangent", [True, False])
def test_a_store_rounds_its_cotangent_where_the_backward_stores_it(cotangent):
    x = torch.tensor([1.0 + 2.0**-12, 3.0], requires_grad=True)
    y = _Stored.apply(x, torch.bfloat16, True, cotangent)
    assert y.tolist() == [1.0, 3.0]
    y.backward(torch.tensor([1.0 + 2.0**-12, -1.0]))
    assert x.grad.tolist() == ([1.0, -1.0] if cotangent else [1.0 + 2.0**-12, -1.0])


def test_stored_is_the_delta_rules_option_with_one_value():
    with pytest.raises(SpecError, match="stored"):
        Spec("identity", True, normalize=False, stored="input-dtype")
    with pytest.raises(SpecError, match="stored"):
        _spec(None, stored="float32")


@pytest.mark.parametrize(
    ("name", "check", "dtype"),
    [
        ("gated-delta-hand-backward", "gradient", "float16"),
        ("gated-delta-hand-backward", "state-gradient", "bfloat16"),
        ("gated-delta-chunked", "reference", "bfloat16"),
    ],
)
def test_a_kernel_that_keeps_float32_passes_with_the_option_declared(name, check, dtype):
    """Declaring stored intermediates widens the budget only where the golden's own rounding
    grows: a correct kernel that keeps everything in float32 still passes (zoo/delta.py,
    zoo/delta_backward.py)."""
    entry = next(e for e in FORWARDS + BACKWARDS if e.name == name)
    impl = resolve(entry.fn, feature_map="identity", causal=True, normalize=False,
                   decay=entry.decay, delta_rule=True, state=entry.state,
                   stored="input-dtype")  # fmt: skip
    result = ALL_CHECKS[check](impl, Case(1, 2, 2 * STORED_CHUNK + 5, 4, 3, dtype, seed=7))
    assert result.passed, result.message


def test_declaring_stored_intermediates_rescues_no_rounding_bug():
    """What the option widens is the stored intermediates' rounding, not a kernel's other
    roundings: the gates' prefix sums in bfloat16 (zoo/delta.py) still fail the decay check
    with the option declared (test_zoo runs vet's advice on every broken entry; no broken
    entry is advised this option, so it is run here)."""
    entry = next(e for e in FORWARDS if e.name == "gated-delta-prefix-in-input-dtype")
    impl = resolve(entry.fn, feature_map="identity", causal=True, normalize=False,
                   decay=entry.decay, delta_rule=True, stored="input-dtype")  # fmt: skip
    case = Case(1, 2, 2 * STORED_CHUNK + 5, 4, 3, "bfloat16", seed=7, decay_rate=1.0)
    result = ALL_CHECKS["decay"](impl, case)
    assert not result.passed and "stored input-dtype" in result.message, result.message


def _row(name: str, case: Case, figures: dict, severity: str = "inaccurate") -> dict:
    kept = [["float32", case.dtype, "fla/ops/common/chunk_delta_h.py:185", "fwd_h's h", 2]]
    return {"name": name, "case": case.to_json(), "severity": severity,
            "figures": {"stored": kept} | figures}  # fmt: skip


def test_stored_intermediates_are_named_where_the_rounded_golden_explains_a_gradient():
    spec, case = _spec("gates"), Case(1, 2, 33, 4, 3, "float16", seed=7)
    over = {"max_error_dg": 0.0017, "budget_dg": 0.0016, "max_error_dq": 0.01, "budget_dq": 0.1,
            "stored_golden_dg": 0.0006, "stored_budget_dg": 0.0024}  # fmt: skip
    cause = name_cause(_row("gradient", case, over), spec)
    assert cause is not None and cause.key == STORED and cause.advice == ("--stored", "input-dtype")
    assert "chunk_delta_h.py:185" in cause.short and "fwd_h's h" in cause.detail
    for without in (
        {"stored": []},  # no narrowed store read back: no evidence of the mechanism
        {"stored_budget_dg": 0.0016},  # declaring it would not account for the error
        {"stored_golden_dg": 0.0017 / 9},  # the rounded golden errs far less: something else
    ):
        assert name_cause(_row("gradient", case, over | without), spec) is None, without
    assert name_cause(_row("gradient", case, over, "wrong"), spec) is None
    declared = _spec("gates", stored="input-dtype")
    assert name_cause(_row("gradient", case, over), declared) is None


def test_stored_intermediates_are_named_where_the_rounded_golden_explains_the_output():
    spec, case = _spec(None), Case(1, 2, 33, 4, 3, "bfloat16", seed=7)
    judgement = Judgement.of_case(case, _spec(None, stored="input-dtype"))
    verdict = judgement(judgement.golden[0])
    explained = _row("reference", case, {"max_error": min(2 * verdict.max_error, verdict.budget)})
    cause = name_cause(explained, spec)
    assert cause is not None and cause.key == STORED, verdict.message
    beyond = _row("reference", case, {"max_error": 1.01 * verdict.budget})
    assert name_cause(beyond, spec) is None
