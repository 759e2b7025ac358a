"""Random features: the statistics of the Performer estimators for the project's samplers
(torch and numpy), and of the built-in implementations' attention against softmax.

Each assertion is a test at level ALPHA = 1e-10 (linattn_verify/stats/decide.py); this file
makes about 160 of them under the ci profile and ten times as many under thorough, far inside
1e-6 a run (docs/architecture.md). The regimes below are where each statement holds and the normal
approximation of the replicate means is good (the stats modules' docstrings explain each).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from linattn_verify.specs import Spec
from linattn_verify.stats import (
    KINDS,
    Sequence1,
    attention_bound,
    bound_check,
    builtin_sampler,
    draw_projections,
    mse_formula,
    numpy_sampler,
    orthogonal_mse,
    rate_check,
    unbiasedness,
)
from linattn_verify.stats.checks import below_iid_applies
from linattn_verify.strategies import kernel_pairs
from linattn_verify.under_test import resolve

pytestmark = pytest.mark.builtin_only  # the project's samplers and forms; vet takes others

# Statistical properties cost ~0.1-1 s an example: a twentieth of the profile (ci 5).
STAT = settings(max_examples=max(3, settings.default.max_examples // 20))
SLOW = settings(max_examples=max(2, settings.default.max_examples // 50))  # 2-10 s an example
SAMPLERS = {
    f"{source}-{kind}": make(kind)
    for source, make in (("torch", builtin_sampler), ("numpy", numpy_sampler))
    for kind in ("iid", "orthogonal")
}
# the regimes of stats/checks.py: |x + y| (|x - y| for trig) and m where the means of the
# replicates are close enough to normal
NORM = {"performer-positive": 1.0, "performer-hyperbolic": 1.0, "performer-trig": 2.0}
MIN_M = {"performer-positive": 16, "performer-hyperbolic": 16, "performer-trig": 1}


@st.composite
def kernel_problem(draw, kind: str, max_d: int = 16):
    d = draw(st.integers(1, max_d), label="d")
    m = draw(st.integers(MIN_M[kind], max(MIN_M[kind], 3 * d)), label="m")
    pair = draw(kernel_pairs(kind, d, (0.05, NORM[kind])), label="pair")
    return d, m, pair


def _run_kernel_check(check, kind, sampler, replicates, data, **options) -> None:
    d, m, pair = data.draw(kernel_problem(kind), label="problem")
    seed = data.draw(st.integers(0, 2**31), label="seed")
    w = draw_projections(SAMPLERS[sampler], m, d, replicates, seed)
    result = check(kind, pair, w, **options)
    assert result.passed, result.report()


@pytest.mark.parametrize("sampler", list(SAMPLERS))
@pytest.mark.parametrize("kind", KINDS)
@STAT
@given(data=st.data())
def test_unbiasedness(kind, sampler, data):
    claim = sampler.split("-")[1]
    _run_kernel_check(unbiasedness, kind, sampler, 2048, data, claim=claim)


@pytest.mark.parametrize("sampler", ["torch-iid", "numpy-iid"])
@pytest.mark.parametrize("kind", KINDS)
@STAT
@given(data=st.data())
def test_mse_matches_lemma_2(kind, sampler, data):
    _run_kernel_check(mse_formula, kind, sampler, 4096, data)


# Orthogonal rows, in the lighter-tailed regime of stats/checks.py, where the exact gain over
# iid rows is large enough for 8192 replicates to show it (below_iid_applies).
ORF_REGIME = {  # kind: (d range, |x +- y| range, rows per call in units of d: partial blocks
    # (m < d), one block, stacked blocks (m > d))
    "performer-positive": ((16, 32), (0.8, 0.9), (2, 3, 4)),
    "performer-hyperbolic": ((16, 32), (0.7, 0.8), (2,)),
    "performer-trig": ((4, 32), (0.8, 1.5), (0.5, 1, 2)),
}


@pytest.mark.parametrize("kind", KINDS)
@SLOW
@given(data=st.data())
def test_orthogonal_features_reduce_mse(kind, data):
    (low, high), norm, blocks = ORF_REGIME[kind]
    d = data.draw(st.integers(low, high), label="d")
    m = max(2, int(d * data.draw(st.sampled_from(blocks), label="blocks")))
    pair = data.draw(kernel_pairs(kind, d, norm, offset=0.25), label="pair")
    seed = data.draw(st.integers(0, 2**31))
    assume(below_iid_applies(kind, pair, m, 8192))
    result = orthogonal_mse(
        kind, pair, draw_projections(SAMPLERS["torch-orthogonal"], m, d, 8192, seed)
    )
    assert result.passed, result.report()


@st.composite
def small_sequences(draw, max_norm: float):
    """One head, N in 2..8, with |q| d^(-1/4), |k| d^(-1/4) <= max_norm and keys apart (equal
    keys get equal weights whatever W is: the output is exact and has no rate)."""
    n, d, dv = draw(st.integers(2, 8)), draw(st.integers(1, 8)), draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="input seed"))
    top = draw(st.floats(0.1, max_norm), label="norm") * d**0.25
    q, k = rng.standard_normal((2, n, d))
    q *= top * rng.uniform(0.2, 1.0, (n, 1)) / np.linalg.norm(q, axis=1, keepdims=True)
    k *= top * rng.uniform(0.2, 1.0, (n, 1)) / np.linalg.norm(k, axis=1, keepdims=True)
    gaps = np.linalg.norm(k[:, None] - k[None], axis=-1) + np.eye(n) * top
    assume(gaps.min() >= 0.05 * top)
    return Sequence1(q, k, rng.standard_normal((n, dv)))


PERFORMER_SPECS = [Spec(kind, causal=c) for kind in KINDS for c in (False, True)]


def _impl(spec: Spec):
    return resolve(spec=spec)


@pytest.mark.parametrize("spec", PERFORMER_SPECS, ids=str)
@SLOW
@given(inputs=small_sequences(max_norm=0.5), seed=st.integers(0, 2**31))
def test_attention_error_falls_as_inverse_sqrt_m(spec, inputs, seed):
    result = rate_check(_impl(spec), builtin_sampler("iid"), inputs, seed=seed)
    assert result.passed, result.report()


@pytest.mark.parametrize("spec", PERFORMER_SPECS, ids=str)
@STAT
@given(inputs=small_sequences(max_norm=1.0), seed=st.integers(0, 2**31))
def test_attention_error_bound(spec, inputs, seed):
    bound = attention_bound(inputs, spec.feature_map, spec.causal, 4096, 0.1)
    assume(math.isfinite(bound))
    result = bound_check(_impl(spec), builtin_sampler("iid"), inputs, 4096, 0.1, 100, seed)
    assert result.passed, result.report()
