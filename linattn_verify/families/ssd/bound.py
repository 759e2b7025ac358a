"""The SSD layer's accuracy model: a componentwise a-priori bound, in units of u s with the
scale s of reference.ssd_scale (docs/ssd.md, "The accuracy model").

In the dual form (reference.py) an output is y_tc = silu(z_tc) (sum_(j<=t) M_tj x_jc +
D_h x_tc), M_tj = C_t^T B_j exp(G_t - G_j) dt_j (without Spec.z_gate the gate's factor is
1 below). First order in u (standard model, Higham, "Accuracy and Stability of Numerical
Algorithms", 2nd ed., Lemma 3.1 and eq. 3.5), every evaluation that forms these products
and sums (the recurrence, the chunked SSD algorithm of Dao & Gu 2024, sec. 6, mamba_ssm's
kernels) errs in term j by at most, relatively:

- dt_j, from s_j = dt'_j + dt_bias_h: without softplus the sum's one rounding, r_j = u;
  with it, the sum's rounding (an error u |s_j| that softplus' = sigmoid carries, relative
  |s_j| sigmoid(s_j) / softplus(s_j)), softplus itself (exp, log1p: 4 units) and, above
  fields.SOFTPLUS_THRESHOLD, s_j returned for softplus(s_j) (log1p(exp(-s_j)) / softplus(s_j)):
  r_j = u (4 + |s_j| sigmoid(s_j) / softplus(s_j)) [+ that cut]. The clamp to [dt_min,
  dt_max] is exact and moves no value further from its exact one;
- the decay exp(G_t - G_j): a product of t - j rounded exponentials (the recurrence) or the
  exponential of a difference of prefix sums over a chunk of C = DECAY_CHUNK tokens (the
  chunked form), whose arguments err by the dt errors (max r) and the prefix sums' (gamma_C
  of the sums of |a| they run over, at most the widest window W of C tokens each):
  exp(gamma_(2 (t - j) + 4) + (|G_t - G_j| + 2 W) (max r + gamma_(C + 2))) - 1;
- the dot product C_t^T B_j and the products with dt_j and x_j: gamma_(d + 3);

and the sums (the state's t additions and the dot product with C_t, or a chunk's block sums
and its carried state; the skip) gamma_(d + t + 2) of their terms' magnitudes. The gate
silu(z) = z sigmoid(z) and the product with it add gamma_5 of |y|. Hence, with |M| and s as
in reference.py, the bound on |y^_tc - y_tc|:
    |silu(z_tc)| (sum_j |M|_tj |x_jc| (rel_tj + gamma_(d+t+2)) + |D x_tc| gamma_(d+t+2)
    + gamma_5 (sum_j |M|_tj |x_jc| + |D x_tc|)) + tiny / 2.
The state S_N's error is the same sum without C_t (|B_jm| for |M|_Nj) and without the gate.
Loose where the decays are strong (W large: typical float32 heads with |A| dt near 2 give
W near 100, a bound of thousands of units), and vacuous for 16-bit inputs there: the budget
judges (its golden keeps the state in float32).
"""

from __future__ import annotations

import numpy as np

from ...inputs import AttentionInputs
from ...reference.certified import SAFETY
from ...rounding import DECAY_CHUNK, gamma
from ...specs import Spec
from .fields import SOFTPLUS_THRESHOLD
from .reference import float64_steps, gates, softplus, ssd_scale, weights


def dt_errors(x: AttentionInputs, spec: Spec, u: float) -> np.ndarray:
    """r_j (B, H, N) of the module docstring: dt's relative error bound."""
    s = x.beta[..., 0] + x.beta[..., 3]
    if not spec.dt_softplus:
        return np.full(s.shape, u)
    dt = softplus(s)
    with np.errstate(over="ignore", invalid="ignore"):
        carried = np.where(dt > 0, np.abs(s) / (1 + np.exp(-s)) / dt, np.inf)
        cut = np.where(s > SOFTPLUS_THRESHOLD, np.log1p(np.exp(-s)) / dt, 0.0)
    return u * (4 + carried) + cut


def relative(x: AttentionInputs, spec: Spec, u: float, last: bool = False) -> np.ndarray:
    """rel_tj (B, H, N, N) of the module docstring (for j <= t; t = N alone with `last`:
    (B, H, 1, N))."""
    n = x.q.shape[2]
    r = dt_errors(x, spec, u)
    _, a = float64_steps(x, spec)
    reach = np.cumsum(np.abs(a), -1)
    window = np.concatenate([np.zeros((*a.shape[:2], 1)), reach], -1)
    chunk = min(DECAY_CHUNK, n)
    widest = np.max(window[..., chunk:] - window[..., : n + 1 - chunk], -1)[..., None, None]
    rows = np.array([n - 1]) if last else np.arange(n)
    span = np.abs(reach[..., rows, None] - reach[..., None, :])
    steps = np.maximum(rows[:, None] - np.arange(n)[None, :], 0)
    with np.errstate(over="ignore", invalid="ignore"):
        decay = np.expm1(
            np.vectorize(lambda m: gamma(int(m), u))(2 * steps + 4)
            + (span + 2 * widest) * (np.max(r, -1)[..., None, None] + gamma(DECAY_CHUNK + 2, u))
        )
    return r[..., None, :] + decay + gamma(x.q.shape[3] + 3, u)


def ssd_scale_and_bound(
    x: AttentionInputs, spec: Spec, ref: np.ndarray | None, u: float, tiny: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """(s, bound in units of u s), each (B, H, N, dv), of the module docstring (ref unused:
    the magnitudes come from the inputs)."""
    n, d = x.q.shape[2:]
    w = weights(x, spec)
    scale = ssd_scale(x, spec, w)
    sums = np.array([gamma(d + t + 2, u) for t in range(n)])[:, None]  # (N, 1)
    size = w @ np.abs(x.v)
    skip = np.abs(x.beta[..., 2:3] * x.v)
    gate = gates(x, spec)
    with np.errstate(over="ignore", invalid="ignore"):
        inner = (w * relative(x, spec, u)) @ np.abs(x.v) + (size + skip) * sums
        absolute = gate * (inner + gamma(5, u) * (size + skip)) + tiny / 2
        bound = np.where(absolute == 0, 0.0, absolute * SAFETY / (u * scale))
    return scale, np.where(np.isnan(bound), np.inf, bound)


def ssd_state_bound(x: AttentionInputs, spec: Spec, u: float, tiny: float = 0.0) -> np.ndarray:
    """A bound on |S^_N - S_N| (B, H, d, dv) after the last token (module docstring), stored
    in precision u: u |S_N| more, and tiny / 2."""
    n = x.q.shape[2]
    dt, a = float64_steps(x, spec)
    g = np.cumsum(a, -1)
    with np.errstate(over="ignore"):
        reach = np.exp(g[..., -1:] - g) * dt  # (B, H, N): exp(G_N - G_j) dt_j
    terms = (
        np.abs(x.k)
        * (reach * (relative(x, spec, u, last=True)[..., 0, :] + gamma(n + 2, u)))[..., None]
    )
    error = np.swapaxes(terms, -1, -2) @ np.abs(x.v)
    exact = np.swapaxes(x.k * reach[..., None], -1, -2) @ x.v
    return (error + u * np.abs(exact) + tiny / 2) * SAFETY
