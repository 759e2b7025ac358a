"""The delta rule's accuracy model: a normwise a-priori bound, and the scale errors are
measured against (docs/delta-rule.md, "The accuracy model").

Each value channel c of the state evolves on its own: x_t = S_t[:, c] in R^d,
    x_t = A_t x_(t-1) + beta_t k_t v_tc,   A_t = (I - beta_t k_t k_t^T) D_t,
D_t = exp(g_t) I, diag(exp(g_t)) or I (families/delta/fields.py). I - beta k k^T has the
eigenvalues 1 (d - 1 times) and 1 - beta |k|^2, so ||A_t||_2 <= rho_t = max_m D_tm
max(1, |1 - beta_t |k_t|^2|): at most 1 for unit keys and beta in [0, 2] (non-expansive).
An error committed at one token is then never amplified by later ones, where a
componentwise bound by absolute values (|A_t| has entries up to 1 + beta) grows like
(1 + beta)^N and judges nothing. For keys that are not unit-norm rho_t is the growth the
product of the A_t actually has in the 2-norm, and the bound grows with it.

Local error of one step (standard model, Higham, "Accuracy and Stability of Numerical
Algorithms", 2nd ed., Lemma 3.1 and eq. 3.5; |k|^T |y| <= |k|_2 |y|_2 by Cauchy-Schwarz),
y_t = D_t x_(t-1): forming D_t x (exp within C_LIB units), the dot k^T y (gamma_d), the
difference with v, the product with beta, the outer-product update and the addition, and
a chunked kernel's sums over the C = DECAY_CHUNK tokens of its chunk (W S, K^T U):
    l_t <= gamma_n [ |y_t| (1 + |beta_t| |k_t|^2) + |beta_t| |k_t| |v_tc| ]
n = d + 5 + C_LIB + C, 2 (d + 3) more for q and k normalised inside (qk_l2norm: the
relative error gamma_(d + 3) of k enters A_t = I - beta k k^T twice), and (2 C + 1) |G|
more with gates (step_roundings), |G| the gates' largest sum over C tokens: a chunked
kernel forms its decays exp(G_i - G_j) from prefix sums within a chunk, each within gamma_C
|G|, their difference within one more rounding (verdict.decay_floor's window), a relative
(2 gamma_C + u) |G| <= gamma_((2 C + 1) |G|) to first order. A chunked kernel solves the
chunk's triangular system (I + L) W = diag(beta) K (the UT transform, L = tril(diag(beta) K
K^T, -1), gated as the decays say; Yang et al. 2024, DeltaNet, sec. 3.1) by substitution,
whose forward error is its backward error gamma_C |I + L| times Skeel's condition number
cond(I + L) = || |(I + L)^-1| |I + L| ||_inf (Higham, Thm. 8.5 and eq. 7.13): the local
errors of a chunk are taken cond(I + L) times larger (>= 1), the largest over the chunks of
at most DECAY_CHUNK tokens that hold the token, wherever they start (_wy_condition). This
factor is a model of the chunked algorithms, not a proof for each: the bound is tested
against arb on adversarial cases (tests/test_delta_bound.py).

Errors propagate as E_t <= rho_t E_(t-1) + cond_t l_t (E_0 = 0: the sequence from its
start; the state checks judge a continued sequence by the bound of the whole). The
product of the A_t contracts where their norms alone do not show it (random unit keys
shrink every direction in turn, once there are a few times d of them): at the end of each
block of max(DECAY_CHUNK, 4 d) tokens (rounded up to a multiple of DECAY_CHUNK) the
error carried into the block is propagated by min(prod rho_t, ||P||_2) instead, P the
block's product A_t ... A_(start) (submultiplicativity and the triangle inequality), which
keeps the bound from growing with N once the products contract (for keys that span a
subspace only, P is the identity on its complement, and the bound grows with N). The
output o_tc = c q_t^T x_t errs by at most
    |c| (|q_t| E_t + gamma_(d + 1) |q_t| |x_t|) (1 + u) + u |o_tc| + tiny / 2,
the state norms |x_t| taken from a float64 evaluation (first order: its own error is far
below float32's unit and enlarges them by less than SAFETY for float64).

The scale: s_tc = |c| |q_t| max_(j <= t) |x_j| (reference.delta.delta_scale, which the
certified engine measures its bounds against too), the largest magnitude of state channel c
that the computation of row t passed through, times the query's; errors are in units of u s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...inputs import AttentionInputs
from ...reference.certified import SAFETY
from ...rounding import C_LIB, DECAY_CHUNK, gamma
from ...specs import Spec
from ..decayed.values import widest_gate_sum
from .fields import QK_L2NORM_EPS
from .reference import delta_scale

# the stride of the windows whose condition numbers cover every chunk (_wy_condition): the
# windows are DECAY_CHUNK + WINDOW_STEP long, their condition numbers grow with it
WINDOW_STEP = 16


@dataclass(frozen=True)
class Propagated:
    """What the module docstring's propagation gives: per token and value channel, the
    error bound E_t (B, H, N, dv) and |x_t|; the scale s (reference.delta.delta_scale);
    |c| |q_t| (B, H, N); the final state S_N (B, H, d, dv), in float64."""

    error: np.ndarray
    norms: np.ndarray
    scale: np.ndarray
    query: np.ndarray
    final: np.ndarray


@dataclass(frozen=True)
class Steps:
    """The per-token factors of the module docstring's steps, shared with the gradients'
    model (delta_gradient.py): q and k as the recurrence uses them (normalised with
    qk_l2norm), the factors exp(g) (B, H, N, d), |k_t|^2 and rho_t (B, H, N), the WY
    condition number cond_t (B, H, N), and the local relative error of a step,
    gamma_n for n = step_roundings."""

    q: np.ndarray
    k: np.ndarray
    decays: np.ndarray
    k2: np.ndarray
    rho: np.ndarray
    cond: np.ndarray
    local: float


def steps(x: AttentionInputs, spec: Spec, u: float) -> Steps:
    """The module docstring's per-token factors for x."""
    q, k = x.q, x.k
    if spec.qk_l2norm:
        q, k = (t / np.sqrt(np.sum(t * t, -1, keepdims=True) + QK_L2NORM_EPS) for t in (q, k))
    logs = _log_decays(x, spec)
    decays = np.exp(logs)
    k2 = np.sum(k * k, -1)
    rho = decays.max(-1) * np.maximum(1.0, np.abs(1 - x.beta * k2))
    local = gamma(step_roundings(x, spec), u)
    return Steps(q, k, decays, k2, rho, _wy_condition(k, x.beta, logs), local)


def step_roundings(x: AttentionInputs, spec: Spec) -> int:
    """The n of a step's local error (module docstring), the gates' term included."""
    d = x.q.shape[-1]
    n = d + 5 + C_LIB + DECAY_CHUNK + 2 * (d + 3) * spec.qk_l2norm
    return n + math.ceil((2 * DECAY_CHUNK + 1) * widest_gate_sum(spec, x))


def propagated(x: AttentionInputs, spec: Spec, u: float) -> Propagated:
    """The state's error bound and magnitudes token by token (module docstring)."""
    f = steps(x, spec, u)
    q, k, beta, decays, k2, rho, cond = f.q, f.k, x.beta, f.decays, f.k2, f.rho, f.cond
    b_, h_, n, d = q.shape
    block = -(-max(DECAY_CHUNK, 4 * d) // DECAY_CHUNK) * DECAY_CHUNK
    state = np.zeros((b_, h_, d, x.v.shape[-1]))
    carried = np.zeros((b_, h_, x.v.shape[-1]))  # the error entering the block, propagated
    within = np.zeros_like(carried)  # the block's own local errors, propagated
    product, growth = np.broadcast_to(np.eye(d), (b_, h_, d, d)), np.ones((b_, h_))
    error, norms = np.empty(x.v.shape), np.empty(x.v.shape)
    for t in range(n):
        y = decays[:, :, t, :, None] * state
        y_norm = np.sqrt(np.sum(y * y, -2))  # (B, H, dv)
        kt, bt = k[:, :, t], beta[:, :, t, None]
        size = y_norm * (1 + np.abs(bt) * k2[:, :, t, None])
        size = size + np.abs(bt) * np.sqrt(k2[:, :, t, None]) * np.abs(x.v[:, :, t])
        with np.errstate(invalid="ignore"):  # a vacuous gamma (inf) times 0 is 0
            local = np.where(size > 0, f.local * size, 0.0)
        carried = rho[:, :, t, None] * carried
        within = rho[:, :, t, None] * within + cond[:, :, t, None] * local
        transition = decays[:, :, t, None, :] * (
            np.eye(d) - bt[..., None] * kt[..., :, None] * kt[..., None, :]
        )
        product, growth = transition @ product, growth * rho[:, :, t]
        if (t + 1) % block == 0:  # the block's product bounds what entered it
            contraction = np.minimum(growth, np.linalg.norm(product, 2, axis=(-2, -1)) * SAFETY)
            carried = carried / np.where(growth > 0, growth, 1)[..., None] * contraction[..., None]
            carried, within = carried + within, np.zeros_like(within)
            product, growth = np.broadcast_to(np.eye(d), (b_, h_, d, d)), np.ones((b_, h_))
        inner = x.v[:, :, t] - np.einsum("bhd,bhdc->bhc", kt, y)
        state = y + kt[..., None] * (bt * inner)[:, :, None, :]
        norms[:, :, t] = np.sqrt(np.sum(state * state, -2))
        error[:, :, t] = carried + within
    c = spec.scale_for(d)
    query = abs(c) * np.sqrt(np.sum(q * q, -1))
    return Propagated(error, norms, delta_scale(q, norms, c), query, state)


def delta_scale_and_bound(
    x: AttentionInputs, spec: Spec, ref: np.ndarray | None, u: float, tiny: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """(s, bound in units of u s), each (B, H, N, dv), of the module docstring; ref the
    exact output or None (then |c| |q_t| |x_t| stands in for |o_tc|)."""
    p = propagated(x, spec, u)
    d = x.q.shape[-1]
    g_out = gamma(d + 1 + (d + 3) * spec.qk_l2norm, u)
    query = p.query[..., None]
    out = query * p.norms if ref is None else np.abs(ref)
    scale = p.scale
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # vacuous: inf, NaN
        absolute = query * (p.error + g_out * p.norms) * (1 + u) + u * out + tiny / 2
        bound = np.where(absolute == 0, 0.0, absolute * SAFETY / (u * scale))
    return scale, np.where(np.isnan(bound), np.inf, bound)


def delta_state_bound(x: AttentionInputs, spec: Spec, u: float, tiny: float = 0.0) -> np.ndarray:
    """A bound on |S_hat - S| (B, H, d, dv) for the state after the last token: the error of
    its column c is at most E_N in the 2-norm, so in each element; stored in precision u,
    u |S| more (which also covers the float64 rounding of the exact state), and tiny / 2."""
    p = propagated(x, spec, u)
    column = p.error[:, :, -1, None, :]
    return (column + u * np.abs(p.final) + tiny / 2) * SAFETY


def _log_decays(x: AttentionInputs, spec: Spec) -> np.ndarray:
    """The log-gates g_t per key channel, (B, H, N, d) (0 without a decay)."""
    b_, h_, n, d = x.q.shape
    if spec.decay is None:
        return np.zeros((b_, h_, n, d))
    g = x.decay if spec.decay == "channel-gates" else x.decay[..., None]
    return np.broadcast_to(g, (b_, h_, n, d))


def _wy_condition(k: np.ndarray, beta: np.ndarray, logs: np.ndarray) -> np.ndarray:
    """Skeel's condition number of the I + L (module docstring) of any chunk of at most
    DECAY_CHUNK tokens, wherever it starts (a kernel continuing a state at token 17 chunks
    from there), per token (B, H, N): a window of DECAY_CHUNK + WINDOW_STEP tokens from
    every multiple of WINDOW_STEP holds each such chunk, and a contiguous principal block
    of a triangular matrix has the same block of its inverse, so the chunk's |T^-1| |T| is
    entrywise at most the window's and its row sums no larger; each token takes the
    largest of its windows'. L_ij = beta_i sum_m k_im k_jm exp(G_im - G_jm) for j < i, from
    the log-gates (B, H, N, d) themselves (an exp(g) that underflows has no log)."""
    b_, h_, n, _ = k.shape
    cond = np.ones((b_, h_, n))
    for start in range(0, max(n - DECAY_CHUNK, 1), WINDOW_STEP):
        part = slice(start, min(start + DECAY_CHUNK + WINDOW_STEP, n))
        kc, bc = k[:, :, part], beta[:, :, part]
        prefix = np.cumsum(logs[:, :, part], axis=2)  # (B, H, C, d)
        diff = prefix[:, :, :, None, :] - prefix[:, :, None, :, :]  # G_i - G_j
        size = kc.shape[2]
        lower = np.tril(np.ones((size, size), dtype=bool), -1)
        ratio = np.exp(np.where(lower[..., None], diff, -np.inf))
        gram = np.einsum("bhim,bhjm,bhijm->bhij", kc, kc, ratio)
        system = np.eye(size) + bc[..., None] * gram
        inverse = np.linalg.inv(system)
        skeel = np.max(np.sum(np.abs(inverse) @ np.abs(system), -1), -1)
        cond[:, :, part] = np.maximum(cond[:, :, part], skeel[..., None])
    return cond
