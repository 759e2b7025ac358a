"""The IPLR rule's accuracy model: a normwise a-priori bound, and the scale errors are
measured against (docs/iplr.md, "The accuracy model").

Each value channel c of the state evolves on its own: x_t = S_t[:, c] in R^d,
    x_t = M_t x_(t-1) + k_t v_tc,   M_t = I + b_t a_t^T   (reference.py's definition).
M_t's 2-norm is rho_t = sqrt(1 + lambda_t) exactly (reference.transition_norms, from the
inputs), at most 1 + |a_t| |b_t|: 1 for DeltaNet's I - beta k k^T with a unit k and beta in
[0, 2], a little above 1 for RWKV-7's I - (alpha . kappa) kappa^T (not normal), and up to
1 + |a| |b| where the transition expands (DESIGN.md, "Spec families": a transition that may
expand carries the product of its norms, computed from the inputs). The crude 1 + |a| |b|
would be 2 per token for DeltaNet's inputs, 2^N over a sequence: a bound that judges
nothing; the exact norm costs a 2 x 2 eigenvalue.

Local error of one step (standard model, Higham, "Accuracy and Stability of Numerical
Algorithms", 2nd ed., Lemma 3.1 and eq. 3.5; |a|^T |x| <= |a|_2 |x|_2 by Cauchy-Schwarz):
the dot product a^T x (gamma_d), its product with b, the product k v, the two additions, and
a chunked kernel's sums over the C = DECAY_CHUNK tokens of its chunk (W S, K^T V, B^T U):
    l_t <= gamma_n [ |x_(t-1)| (1 + |a_t| |b_t|) + |k_t| |v_tc| ],   n = d + 3 + C.
A chunked kernel (fla's iplr_chunkwise and chunk_iplr_delta_rule; Yang et al. 2024,
"Parallelizing linear transformers with the delta rule", sec. 3 and its generalisation to
I + b a^T transitions) solves the chunk's unit lower triangular system (I - tril(A B^T, -1))
U = A S + tril(A K^T, -1) V for the pseudo-values u_t = a_t^T S_(t-1) by substitution, whose
forward error is its backward error times Skeel's condition number cond(T) = || |T^-1| |T|
||_inf (Higham, Thm. 8.5 and eq. 7.13): a chunk's local errors are taken cond(T) times
larger, the largest over the windows that hold any chunk of at most C tokens containing the
token (_condition). This factor models the chunked algorithms, it is no proof for each: the
bound is tested against arb on typical and stress inputs (tests/test_iplr.py).

Errors propagate as E_t <= rho_t E_(t-1) + cond_t l_t (E_0 = 0: the sequence from its start).
The product of the M_t may contract where their norms do not show it (unit removal keys in
turn shrink every direction): at the end of each block of BLOCK = C tokens the error
carried into the block is propagated by min(prod rho_t, ||P||_2), P the block's product
M_t ... M_start (submultiplicativity), as the delta rule's model does (there every max(C,
4 d) tokens; non-normal transitions need the shorter blocks: BLOCK). Loose where the
transitions are far from normal and d is large: for RWKV-7's typical a and b in float32
the largest bound times u is 3 at d = 16 and N = 256, 7 at d = 64 and N = 256, 77 at N =
1024 (medians 0.31, 0.35 and 3.3): the budget judges there. The output
o_tc = c q_t^T x_t errs by at most
    |c| (|q_t| E_t + gamma_(d + 1) |q_t| |x_t|) (1 + u) + u |o_tc| + tiny / 2,
the state norms |x_t| from a float64 evaluation (reference.float64_states; first order).

The scale: s_tc = |c| |q_t| max_(j <= t) |x_j| (reference.iplr_scale), errors in units of u s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...inputs import AttentionInputs
from ...reference.certified import SAFETY
from ...rounding import DECAY_CHUNK, gamma
from ...specs import Spec
from .reference import float64_states, iplr_scale, split, transition_norms

# the stride of the windows whose condition numbers cover every chunk (_condition)
WINDOW_STEP = 16
# tokens between the block products' norms (module docstring): a chunk's. Non-normal
# transitions (RWKV-7's) have rho_t of 1.04 to 1.05 on typical inputs, so that the product
# of the norms over a block grows as 1.05^BLOCK while the block's product stays near 1
# (d = 64) or contracts (d = 8): longer blocks (the delta rule's 4 d) would multiply the
# errors within them by 1.05^256 at d = 64
BLOCK = DECAY_CHUNK


@dataclass(frozen=True)
class Propagated:
    """Per token and value channel: the error bound E_t (B, H, N, dv) and |x_t|; the scale
    s; |c| |q_t| (B, H, N); the final state S_N (B, H, d, dv), in float64."""

    error: np.ndarray
    norms: np.ndarray
    scale: np.ndarray
    query: np.ndarray
    final: np.ndarray


def step_roundings(d: int) -> int:
    """The n of a step's local error (module docstring)."""
    return d + 3 + DECAY_CHUNK


def propagated(x: AttentionInputs, spec: Spec, u: float) -> Propagated:
    """The state's error bound and magnitudes token by token (module docstring)."""
    a, b = split(x)
    b_, h_, n, d = x.q.shape
    dv = x.v.shape[-1]
    norms, final = float64_states(x)
    before = np.concatenate([np.zeros((b_, h_, 1, dv)), norms[:, :, :-1]], axis=2)
    rho = transition_norms(a, b) * SAFETY  # (B, H, N)
    ab = np.sqrt(np.sum(a * a, -1) * np.sum(b * b, -1))
    kn = np.sqrt(np.sum(x.k * x.k, -1))
    size = before * (1 + ab[..., None]) + kn[..., None] * np.abs(x.v)
    with np.errstate(invalid="ignore"):  # a vacuous gamma (inf) times 0 is 0
        local = np.where(size > 0, gamma(step_roundings(d), u) * size, 0.0)
    local = local * _condition(a, b)[..., None]
    block = BLOCK
    carried, within = np.zeros((b_, h_, dv)), np.zeros((b_, h_, dv))
    product, growth = np.broadcast_to(np.eye(d), (b_, h_, d, d)), np.ones((b_, h_))
    error = np.empty(x.v.shape)
    for t in range(n):
        carried = rho[:, :, t, None] * carried
        within = rho[:, :, t, None] * within + local[:, :, t]
        transition = np.eye(d) + b[:, :, t, :, None] * a[:, :, t, None, :]
        product, growth = transition @ product, growth * rho[:, :, t]
        if (t + 1) % block == 0:  # the block's product bounds what entered it
            with np.errstate(over="ignore", invalid="ignore"):
                shrink = np.linalg.norm(product, 2, axis=(-2, -1)) * SAFETY
                contraction = np.minimum(growth, shrink)
                ratio = np.where(growth > 0, contraction / growth, 1.0)
            carried = np.where(np.isfinite(ratio), ratio, 1.0)[..., None] * carried + within
            within = np.zeros_like(within)
            product, growth = np.broadcast_to(np.eye(d), (b_, h_, d, d)), np.ones((b_, h_))
        error[:, :, t] = carried + within
    c = spec.scale_for(d)
    query = abs(c) * np.sqrt(np.sum(x.q * x.q, -1))
    return Propagated(error, norms, iplr_scale(x.q, norms, c), query, final)


def iplr_scale_and_bound(
    x: AttentionInputs, spec: Spec, ref: np.ndarray | None, u: float, tiny: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """(s, bound in units of u s), each (B, H, N, dv), of the module docstring; ref the
    exact output or None (then |c| |q_t| |x_t| stands in for |o_tc|)."""
    p = propagated(x, spec, u)
    g_out = gamma(x.q.shape[-1] + 1, u)
    query = p.query[..., None]
    out = query * p.norms if ref is None else np.abs(ref)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # vacuous: inf, NaN
        absolute = query * (p.error + g_out * p.norms) * (1 + u) + u * out + tiny / 2
        bound = np.where(absolute == 0, 0.0, absolute * SAFETY / (u * p.scale))
    return p.scale, np.where(np.isnan(bound), np.inf, bound)


def iplr_state_bound(x: AttentionInputs, spec: Spec, u: float, tiny: float = 0.0) -> np.ndarray:
    """A bound on |S_hat - S| (B, H, d, dv) after the last token: column c's error is at
    most E_N in the 2-norm, so in each element; stored in precision u, u |S| more, and
    tiny / 2."""
    p = propagated(x, spec, u)
    return (p.error[:, :, -1, None, :] + u * np.abs(p.final) + tiny / 2) * SAFETY


def _condition(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Skeel's condition number of T = I - tril(A B^T, -1) (module docstring) of any chunk
    of at most DECAY_CHUNK tokens, wherever it starts, per token (B, H, N): a window of
    DECAY_CHUNK + WINDOW_STEP tokens from every multiple of WINDOW_STEP holds each such
    chunk, and a contiguous principal block of a triangular matrix has the same block of its
    inverse, so the chunk's |T^-1| |T| is entrywise at most the window's."""
    b_, h_, n, _ = a.shape
    cond = np.ones((b_, h_, n))
    for start in range(0, max(n - DECAY_CHUNK, 1), WINDOW_STEP):
        part = slice(start, min(start + DECAY_CHUNK + WINDOW_STEP, n))
        size = a[:, :, part].shape[2]
        lower = np.tril(a[:, :, part] @ np.swapaxes(b[:, :, part], -1, -2), -1)
        system = np.eye(size) - lower
        with np.errstate(over="ignore", invalid="ignore"):
            inverse = np.linalg.inv(system)
            skeel = np.max(np.sum(np.abs(inverse) @ np.abs(system), -1), -1)
        skeel = np.where(np.isfinite(skeel), skeel, np.inf)
        cond[:, :, part] = np.maximum(cond[:, :, part], skeel[..., None])
    return cond
