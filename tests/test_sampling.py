"""Projection samplers: shapes, orthogonality, chi(d) norms, seeds, errors."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

import linattn_verify as lv

# Under the null (norms truly chi(d)) a KS p-value below this happens with this probability.
FALSE_FAILURE = 1e-6


@pytest.mark.parametrize("kind", list(lv.SAMPLERS))
def test_shape_dtype_and_seed(kind):
    w = lv.sample_projection(10, 4, kind, seed=3)
    assert w.shape == (10, 4) and w.dtype == np.float64
    np.testing.assert_array_equal(w, lv.sample_projection(10, 4, kind, seed=3))
    assert not np.array_equal(w, lv.sample_projection(10, 4, kind, seed=4))


@pytest.mark.parametrize("kind", ["orthogonal", "orthogonal-fixed-norm"])
def test_rows_within_a_block_are_orthogonal(kind):
    d = 6
    w = lv.sample_projection(2 * d + 3, d, kind, seed=0)  # two full blocks and a part
    for start in range(0, w.shape[0], d):
        block = w[start : start + d]
        unit = block / np.linalg.norm(block, axis=1, keepdims=True)
        np.testing.assert_allclose(unit @ unit.T, np.eye(len(block)), atol=1e-12)


def test_orthogonal_norms_are_chi_d_and_fixed_norms_are_sqrt_d():
    d = 8
    norms = np.linalg.norm(lv.sample_projection(4000, d, "orthogonal", seed=0), axis=1)
    assert scipy.stats.kstest(norms, scipy.stats.chi(d).cdf).pvalue > FALSE_FAILURE
    fixed = np.linalg.norm(lv.sample_projection(40, d, "orthogonal-fixed-norm", seed=0), axis=1)
    np.testing.assert_allclose(fixed, np.sqrt(d), rtol=1e-14)
    assert scipy.stats.kstest(fixed, scipy.stats.chi(d).cdf).pvalue < FALSE_FAILURE


def test_only_the_fixed_norm_sampler_is_flagged_biased():
    assert {n for n, s in lv.SAMPLERS.items() if not s.unbiased} == {"orthogonal-fixed-norm"}


def test_iid_entries_are_standard_normal():
    w = lv.sample_projection(500, 8, "iid", seed=0).ravel()
    assert scipy.stats.kstest(w, "norm").pvalue > FALSE_FAILURE


@pytest.mark.parametrize(
    ("args", "message"),
    [((4, 2, "sobol"), "unknown projection sampler"), ((0, 2, "iid"), "positive integers")],
)
def test_bad_sampler_arguments(args, message):
    with pytest.raises(lv.SpecError, match=message):
        lv.sample_projection(*args)
