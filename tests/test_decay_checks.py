"""The checks adapted to decayed specs (checks.WITH_DECAY): batch-head, layout, v-affine,
positivity, convex-hull and varlen pass the decay, sliced where the inputs are (core.decay_part),
and pass on the built-in forms; kernels that misread the gates fail them."""

from __future__ import annotations

import itertools

import pytest
import torch

from linattn_verify.cases import Case
from linattn_verify.checks import CHECKS, NORMALISED, not_applicable
from linattn_verify.under_test import resolve

ADAPTED = ("batch-head", "layout", "v-affine", "positivity", "convex-hull", "varlen")
CASE = Case(2, 2, 9, 3, 2, "float32", seed=3)
BUILT_IN = {
    "elu-chunked-gates": dict(form="chunked", feature_map="elu", decay="gates"),
    "elu-chunked-constant": dict(form="chunked", feature_map="elu", decay="constant"),
    "identity-recurrent-gates-unnormalised": dict(
        form="recurrent", feature_map="identity", decay="gates", normalize=False
    ),
}


def _run(impl, name: str, case: Case = CASE):
    return CHECKS[name](impl, case)


@pytest.mark.parametrize("options", BUILT_IN.values(), ids=BUILT_IN.keys())
def test_the_adapted_checks_run_with_a_decay_and_pass_on_the_built_in_forms(options):
    impl = resolve(causal=True, varlen=True, **options)
    for name in ADAPTED:
        why = not_applicable(name, impl)
        if not impl.spec.normalize and name in NORMALISED:
            assert why == "an unnormalised output is no weighted mean of v"
            continue
        assert why is None, (name, why)
        result = _run(impl, name)
        assert result.passed, (name, result.message)


def test_permutation_stays_not_applicable_to_a_decayed_spec():
    impl = resolve(form="chunked", feature_map="elu", causal=True, decay="gates")
    assert not_applicable("permutation", impl) is not None


def _weights(q, k, g):
    """a_ij w_ij of causal elu attention with log-gates g (B, H, N), in float64:
    w_ij = exp(G_i - G_j) for j <= i, G the prefix sums of g."""
    qf, kf = (torch.nn.functional.elu(t.double()) + 1 for t in (q, k))
    prefix = g.double().cumsum(-1)
    n = q.shape[-2]
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    logs = torch.where(causal, prefix[..., :, None] - prefix[..., None, :], -torch.inf)
    return (qf @ kf.mT) * torch.exp(logs)


def _gated(q, k, v, g, den=None):
    """The quadratic form with the gates g, normalised by den's weights (default g's)."""
    weights = _weights(q, k, g)
    norm = weights if den is None else _weights(q, k, den)
    return ((weights @ v.double()) / norm.sum(-1, keepdim=True)).to(q.dtype)


def correct(q, k, v, g):
    return _gated(q, k, v, g)


def first_head_gates_only(q, k, v, g):
    """BUG: the gates of heads h > 0 are ignored (a decay of 1)."""
    return _gated(q, k, v, torch.cat([g[:, :1], torch.zeros_like(g[:, 1:])], 1))


def first_batch_gates(q, k, v, g):
    """BUG: every batch element reads the gates of batch element 0."""
    return _gated(q, k, v, g[:1].expand_as(g))


def undecayed_normaliser(q, k, v, g):
    """BUG: the numerator decays, the denominator sums the undecayed similarities."""
    return _gated(q, k, v, g, den=torch.zeros_like(g))


def _callable(fn, **options):
    return resolve(fn, feature_map="elu", causal=True, decay="gates", **options)


def test_a_correct_gated_kernel_passes_batch_head_layout_and_v_affine():
    for name in ("batch-head", "layout", "v-affine", "convex-hull"):
        result = _run(_callable(correct), name)
        assert result.passed, (name, result.message)


def test_a_bnhd_kernel_gets_its_gates_in_its_own_layout():
    def bnhd(q, k, v, g):
        assert g.shape == (*q.shape[:3],)  # (B, N, H)
        out = _gated(*(t.transpose(1, 2) for t in (q, k, v)), g.transpose(1, 2))
        return out.transpose(1, 2)

    for name in ("layout", "batch-head"):
        result = _run(_callable(bnhd, layout="bnhd"), name)
        assert result.passed, (name, result.message)


@pytest.mark.parametrize("fn", [first_head_gates_only, first_batch_gates])
def test_batch_head_fails_a_kernel_that_misreads_whose_gates(fn):
    result = _run(_callable(fn), "batch-head")
    assert not result.passed
    assert "each (b, h) alone" in result.message


def test_v_affine_fails_a_normaliser_without_the_decay():
    result = _run(_callable(undecayed_normaliser), "v-affine")
    assert not result.passed and "out(-2 V" in result.message


def _packed(fn):
    """fn of each packed sequence, the gates `fn` picks for tokens a..b-1."""

    def kernel(q, k, v, g, cu_seqlens=None):
        if cu_seqlens is None:
            return correct(q, k, v, g)
        out = torch.empty_like(v)
        for a, b in itertools.pairwise(int(t) for t in cu_seqlens.tolist()):
            if b > a:
                part = (t[..., a:b, :] for t in (q, k, v))
                out[..., a:b, :] = correct(*part, fn(g, a, b))
        return out

    return kernel


def test_varlen_passes_each_sequence_its_own_gates():
    result = _run(_callable(_packed(lambda g, a, b: g[..., a:b]), varlen=True), "varlen")
    assert result.passed, result.message


def test_varlen_fails_gates_read_from_the_row_s_start():
    result = _run(_callable(_packed(lambda g, a, b: g[..., : b - a]), varlen=True), "varlen")
    assert not result.passed
    assert "of a packed batch" in result.message and "against its own run" in result.message
