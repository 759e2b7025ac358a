"""The features' error model: psi(x_i), a bound on the absolute error of any sane evaluation
of phi(x_i) in precision u (feature_errors), under the feature model in force.

Standard model (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., sec. 2.2
and 3.1): fl(a op b) = (a op b)(1 + delta), |delta| <= u, no underflow or overflow;
elementary functions return within C_LIB units. Feature models (FEATURE_MODEL,
feature_model): "standard" admits every sane evaluation of each map, the textbook ones
included: elu(x) + 1 as F.elu(x) + 1 = (exp(x) - 1) + 1, whose error is absolute (C_LIB u)
rather than relative, the usual max stabilisers of the exponential maps, any summation
order. "relative" (vet --strict) holds elu features to relative accuracy in entirely
negative rows too, as a shifted evaluation attains (the golden implementation's). Shared by
the output bound (bound.py, ball_sums.py, fast_sums.py) and the state bounds
(state_bounds.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np

from ..reference.certified import SAFETY, float_features, performer_arguments
from ..reference.certified_decay import FEW_ROUNDINGS
from ..rounding import C_LIB, gamma

# ln of float32's largest value: an unshifted exp(x) below -88 underflows float32, so any
# working elu implementation shifts rows that negative (float64 ones may not: 745 there,
# and their extra error |r| u beyond 88 u is charged to them)
ELU_UNSHIFTED_MAX = 88.0


FEATURE_MODELS = ("standard", "relative")
FEATURE_MODEL: ContextVar[str] = ContextVar("feature_model", default="standard")


@contextmanager
def feature_model(model: str) -> Iterator[None]:
    """Bounds computed inside the block assume `model` (FEATURE_MODELS) for the features."""
    if model not in FEATURE_MODELS:
        raise ValueError(f"feature model {model!r}; known: {', '.join(FEATURE_MODELS)}")
    token = FEATURE_MODEL.set(model)
    try:
        yield
    finally:
        FEATURE_MODEL.reset(token)


def feature_errors(
    x: np.ndarray,
    positions: np.ndarray,
    big_m: int,
    w,
    name: str,
    u: float,
    stab: float,
    phi: np.ndarray,
) -> np.ndarray:
    """psi(x_i): bounds on the absolute error of any sane evaluation of phi(x_i) in
    precision u, given |phi| <= phi (float64 upper bounds); inflated by SAFETY, which
    covers this function's own float64 arithmetic.

    stab bounds the magnitude of the stabiliser a Performer implementation may subtract from
    its exponents (the largest exponent of the head).
    """
    # x + 1 (one rounding), or exp(x) for x <= 0 without cancellation: directly (C_LIB
    # relative), as exp2(x log2 e) (absolute |x| e^x u), or shifted by the row's largest
    # coordinate r < 0, exp(x - r) e^r (absolute |x - r| e^(x - r) u <= u / e, times e^r).
    # |x| e^x <= e^r (|r| e^(x - r) + 1/e), and no implementation leaves a row unshifted
    # below -ELU_UNSHIFTED_MAX (exp underflows there): within u (C_LIB e^r + phi + min(|r|,
    # ELU_UNSHIFTED_MAX) phi). In a row with a positive coordinate (r = 0) this is u (C_LIB +
    # phi) and admits expm1(x) + 1; in an entirely negative row the relative model does not:
    # expm1(x) + 1 cancels there (to exactly 0 below -17 in float32). The standard model
    # admits it there too: its error is within (e^x + C_LIB (1 - e^x)) u (1 + u), so the
    # absolute term is C_LIB u whatever the row.
    if name == "elu":
        top = np.minimum(x.max(axis=1, keepdims=True), 0.0)
        big = C_LIB * (1.0 if FEATURE_MODEL.get() == "standard" else np.exp(top))
        lift = 1 + np.minimum(-top, ELU_UNSHIFTED_MAX)
        psi = np.where(x > 0, phi, big + lift * phi) * u * (1 + u)
    elif name in ("relu", "identity"):  # exact features
        psi = np.zeros_like(phi)
    elif name == "cosformer":
        # theta = pi i / 2M after 3 roundings: |d theta| <= 3 u theta; cos and sin add C_LIB u
        # (absolute, not relative: cos is small near pi/2); the product with relu(x) one more
        theta = np.pi * positions[:, None] / (2 * big_m)
        rel = np.maximum(x, 0.0) * (3 * theta + C_LIB) * u * (1 + u)
        psi = np.concatenate([rel, rel], 1) + phi * u
    elif name == "taylor":
        # 1 exact; x' = x / d^(1/4): the root (C_LIB) and the division (1); x'_a x'_b / sqrt(2):
        # two such factors, their product, sqrt(2) (C_LIB) and the division: 3 C_LIB + 4
        _n, d = x.shape
        lin, quad = gamma(C_LIB + 1, u), gamma(3 * C_LIB + 4, u)
        rel = np.concatenate([np.zeros(1), np.full(d, lin), np.full(d * d, quad)])
        psi = phi * rel
    else:
        psi = _performer_errors(x, w, name, u, stab, phi)
    return psi * SAFETY


def _grow(rel, g: float):
    """(1 + rel)(1 + g) - 1: relative errors compose."""
    return (1 + rel) * (1 + g) - 1


def _performer_errors(x, w, name: str, u: float, stab: float, phi: np.ndarray) -> np.ndarray:
    """psi of the Performer maps (feature_errors)."""
    d, m = x.shape[1], w.shape[0]
    _, _, half_sq, err_half = performer_arguments(x, w)
    hs = half_sq + err_half
    norms = (np.abs(x) @ np.abs(w).T) * SAFETY
    scale = d**-0.25 * SAFETY
    # exponent: the dot product over d, x' = x d^(-1/4) (C_LIB + 1), subtracting |x'|^2/2 and
    # a stabiliser (2), exp as exp2(x log2 e) (1); then the value: a feature may be formed
    # as exp(a - max a) exp(scale - shift) (two exps, 2 C_LIB, and their product, 1) and
    # divided by sqrt(m) (1)
    g_arg, g_lib = gamma(d + C_LIB + 4, u), gamma(2 * C_LIB + 2, u)
    with np.errstate(over="ignore", invalid="ignore"):
        if name == "performer-trig":  # exp(|x'|^2/2)/sqrt(m) times sin/cos of W x'
            rel_e = _grow(np.expm1(g_arg * (hs + stab)), g_lib)
            e = np.exp(hs) / math.sqrt(m) * SAFETY
            dtheta = g_arg * np.concatenate([norms, norms], 1) * scale + C_LIB * u
            return phi * rel_e + e * dtheta * (1 + rel_e)
        dalpha = g_arg * (norms * scale + hs + stab)  # exp(+-W x' - |x'|^2/2) / sqrt(m or 2m)
        if name == "performer-hyperbolic":
            dalpha = np.concatenate([dalpha, dalpha], 1)
        return phi * _grow(np.expm1(dalpha), g_lib)


def _stabiliser(q: np.ndarray, k: np.ndarray, w, name: str) -> float:
    """Largest |exponent| over the head's queries and keys for the Performer maps."""
    if not name.startswith("performer"):
        return 0.0
    tops = [0.0]
    for rows in (q, k):
        proj, err_proj, half_sq, err_half = performer_arguments(rows, w)
        tops.append(float(np.max(np.abs(proj) + err_proj + half_sq + err_half)))
    return max(tops) * SAFETY


def _features(x: np.ndarray, positions: np.ndarray, big_m: int, w, name: str, u, stab):
    """(features in float64, upper bounds on the exact |phi(x_i)|, psi(x_i))."""
    f = float_features(x, positions, big_m, w, name)
    a = (np.abs(f.phi) + f.err) * FEW_ROUNDINGS  # |phi^| + err, rounded: two roundings
    return f, a, feature_errors(x, positions, big_m, w, name, u, stab, a)
