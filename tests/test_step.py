"""The step contract (--step, docs/contract.md "Step kernels"): what may declare it, a
normalised step kernel (--step Sz, in the bnhd layout) judged right by the step checks
and the decoded ones, the checks not applicable without it, and the reproduce command.
The zoo's step kernels are judged in test_zoo.py."""

from __future__ import annotations

import shlex

import pytest
import torch

from linattn_verify.cases import Case
from linattn_verify.checks import CHECKS, GRAD_CHECKS, STEP_CHECKS, not_applicable
from linattn_verify.cli import main
from linattn_verify.specs import SpecError
from linattn_verify.under_test import resolve
from tests.zoo.step import step_gated

GATED = {"feature_map": "identity", "causal": True, "normalize": False, "decay": "gates"}


def step_elu_bnhd(q, k, v, cache, slots):
    """Causal elu attention, one token per request in the (B, N, H, d) layout, the state
    (S, z) of request b in slot slots[b] (-1: skipped)."""
    s_cache, z_cache = cache
    rows, out = slots >= 0, q.new_zeros(*q.shape[:3], v.shape[-1])
    at = slots[rows]
    fq, fk = (torch.nn.functional.elu(t[rows, 0].to(s_cache.dtype)) + 1 for t in (q, k))
    s = s_cache[at] + fk[..., :, None] * v[rows, 0, :, None, :].to(s_cache.dtype)
    z = z_cache[at] + fk
    s_cache[at], z_cache[at] = s, z
    num = torch.einsum("bhf,bhfc->bhc", fq, s)
    out[rows, 0] = (num / (fq * z).sum(-1, keepdim=True)).to(q.dtype)
    return out


@pytest.mark.parametrize(
    ("target", "options", "message"),
    [
        (step_gated, {**GATED, "step": "Sz"}, "the state of"),
        (step_gated, {**GATED, "step": "S", "state": "S"}, "drop --state"),
        (step_elu_bnhd, {"feature_map": "elu", "step": "Sz"}, "non-causal"),
        (None, {"feature_map": "elu", "causal": True, "step": "Sz"}, "no step kernels"),
        ("fla.based-naive", {"step": "S"}, "no adapter maps a step kernel"),
    ],
)  # fmt: skip
def test_declaring_a_step_that_cannot_be_is_a_spec_error(target, options, message):
    with pytest.raises(SpecError, match=message):
        resolve(target, load=False, **options)


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("n", [1, 5, 20])
def test_a_normalised_step_kernel_in_bnhd_passes_the_step_checks(n, dtype):
    impl = resolve(step_elu_bnhd, feature_map="elu", causal=True, step="Sz", layout="bnhd")
    case = Case(2, 3, n, 4, 5, dtype, seed=n)
    for name in (*STEP_CHECKS, "reference", "contract", "layout", "batch-head"):
        result = CHECKS[name](impl, case)
        assert result.passed, f"{name}: {result.message}"


def test_the_step_checks_apply_with_step_and_the_gradient_checks_do_not():
    plain = resolve(step_gated, **GATED, state="S")
    step = resolve(step_gated, **GATED, step="S")
    assert {n: not_applicable(n, plain) for n in STEP_CHECKS} == dict.fromkeys(
        STEP_CHECKS, "no --step declared"
    )
    assert not any(not_applicable(n, step) for n in STEP_CHECKS)
    assert all("not part of serving" in not_applicable(n, step) for n in GRAD_CHECKS)


def test_the_reproduce_command_names_the_step(capsys):
    impl = resolve(step_gated, **GATED, step="S")
    words = shlex.split(impl.reproduce("step-cache", Case(2, 2, 9, 4, 3, "float32", seed=4)))
    assert words[words.index("--step") + 1] == "S"
    assert main(words[3:]) == 0
    assert "step-cache: pass" in capsys.readouterr().out
