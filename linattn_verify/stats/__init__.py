"""Statistical checks of random-feature estimators (docs/architecture.md): unbiasedness,
the MSE of Lemma 2 (Choromanski et al. 2021), orthogonal features, the m^(-1/2) rate of the
attention error and a high-probability bound on it; a sampler's verdict (`check_sampler`)."""

from ..cases import Pair
from .attention import (
    RATE_RANGE,
    Sequence1,
    attention_bound,
    bound_check,
    fit_rate,
    rate_check,
    rate_not_applicable,
    regime_inputs,
    rmse_by_m,
)
from .checks import mse_formula, orthogonal_mse, unbiasedness
from .decide import ALPHA, MeanTest, mean_test
from .estimators import (
    SamplerFailure,
    SamplerFn,
    builtin_sampler,
    draw_projections,
    kernel_estimates,
    numpy_sampler,
)
from .moments import KINDS, mse_iid, mse_orthogonal, pair_moment, softmax_kernel
from .panel import CLAIMS, check_sampler

__all__ = [
    "ALPHA",
    "CLAIMS",
    "KINDS",
    "RATE_RANGE",
    "MeanTest",
    "Pair",
    "SamplerFailure",
    "SamplerFn",
    "Sequence1",
    "attention_bound",
    "bound_check",
    "builtin_sampler",
    "check_sampler",
    "draw_projections",
    "fit_rate",
    "kernel_estimates",
    "mean_test",
    "mse_formula",
    "mse_iid",
    "mse_orthogonal",
    "numpy_sampler",
    "orthogonal_mse",
    "pair_moment",
    "rate_check",
    "rate_not_applicable",
    "regime_inputs",
    "rmse_by_m",
    "softmax_kernel",
    "unbiasedness",
]
