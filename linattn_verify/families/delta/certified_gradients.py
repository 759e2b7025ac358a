"""Certified gradients of the delta rule at length: dL/dq, dL/dk, dL/dv, dL/dbeta (dL/dg of
the log-gates, dL/dS_0) in float64, O(N), each element with a rigorous bound on its error.

Definitions and the reverse-mode recurrence: families/delta/gradients.py's module docstring
(Lam_t = dL/dS_t, Lam'_t = (I - beta_t k_t k_t^T) Lam_t, Lam_(t-1) = D_t Lam'_t + c q_(t-1)
G_(t-1)^T; dq, dk, dv, dbeta, dg, dS_0, qk_l2norm's Jacobian). Covered: every delta-rule
spec (decay None, "gates", "channel-gates"; qk_l2norm or not; any scale; any beta, the bound
growing like prod G_t where G_t > 1), with or without g_state and initial_state.

Evaluation. The forward in float64 token by token, all heads at once (no transition
columns, unlike delta.float64_delta), keeping S^ and its bound E only at the start of each
BLOCK of tokens; the backward goes over the blocks last to first, recomputes each block's
forward from its checkpoint (y^_t, u^_t, S^_t and their bounds), then runs the adjoint
through it token by token and forms the gradients of the block's tokens: the forward runs
twice, the adjoint once. Memory: N / BLOCK checkpoints (B H d dv doubles each), one block's
six arrays of BLOCK B H d dv doubles, and the inputs, gradients and bounds, O((d + dv) B H N)
doubles: measured (tracemalloc, one head, d = dv = 16) a peak of 5 to 8 MiB at N = 4096 and
17 to 27 MiB at N = 16384; time 1 to 2 s and 4 to 7 s (the 2-core machine, shared).

Bounds (standard model, Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed.,
Lemma 3.1 and eq. 3.5: gamma_n; numpy's exp within LIB; first-order terms, the second-order
ones below SAFETY's slack for N < delta.MAX_TOKENS; every bound times SAFETY; |.| of a
column the 2-norm, which bounds each of its elements; hats the computed values). Per token
t and value column c, with K >= |k_t|, |k^_t|, Q >= |q_t|, |q^_t|, eta = gamma_(d/2+3) the
elementwise error of a normalised q^ or k^ (0 without qk_l2norm), eta_e = LIB + u for
exp(g) (0 without a decay), eps_c = LIB for c = d^-0.5 (0 for a given scale), top = max_m
exp(g_tm) (1 + LIB), spread >= |I - beta k k^T|_2 = max(1, |1 - beta |k|^2|) and G_t = top
spread (delta._growth's):

Forward (delta.float64_delta's model; E_(-1) = 0 from an exact S_0):
    |y^_t - y_t|    <= Ey = top E_(t-1) + (LIB + 2u) |y^|             (y^ = S^ without a decay)
    |u^_tc - u_tc|  <= Eu = gamma_(d+1) (|v_c| + K |y^|) + eta K |y^| + K Ey
    |S^_t - S_t|    <= E_t = G_t E_(t-1) + |r_t|,  |r_t| <= (gamma_(d+4) + eta_e) (|y^| (1 +
                       |beta| K^2) + |beta| K |v_c|) + 2 eta |beta| K (K |y^| + |v_c|)
Backward, the transposed transition's 2-norm being the forward's (Lam^ the computed adjoint,
C^_t = fl(D_(t+1) Lam'^_(t+1)) the carried part, C^ = G_S exactly at t = N - 1):
    |Lam^_t - Lam_t|   <= F_t = F^C_t + |c| Q |G_tc| (eps_c + eta + 2u) + u |Lam^_t|
    |kl^_tc - kl_tc|   <= Ekl = K F_t + (eta + gamma_d) K |Lam^_t|   (kl = Lam_t^T k_t)
    |Lam'^_t - Lam'_t| <= Fp_t = spread F_t + (gamma_(d+3) + 2 eta) (1 + |beta| K^2) |Lam^_t|
    F^C_(t-1) = top Fp_t + (LIB + 2u) top |Lam'^_t|                   (F^C = Fp without a decay)
the second line of Fp being fl(Lam^ - k^ fl(beta fl(k^T Lam^))) against (I - beta k k^T)
Lam^, k^'s error included. Gradients, each element (sums over value columns c; |.| of a
matrix elementwise):
    dv_tc   = beta kl_c:             |beta| Ekl_c + u |dv^_tc|
    dbeta_t = sum_c kl_c u_c:        sum_c [Ekl_c |u^_c| + (|kl^_c| + Ekl_c) Eu_c]
                                     + gamma_dv sum_c |kl^_c u^_c|
    dk_t    = beta (Lam u - y kl):   |beta| [sum_c (F_c |u^_c| + Ey_c |kl^_c|) + |Lam^| Eu
                                     + |y^| Ekl + gamma_(dv+1) (|Lam^| |u^| + |y^| |kl^|)]
                                     + u |dk^_t|
    dq_t    = c S_t G_t:             |c| [sum_c E_t,c |G_tc| + (gamma_(dv+1) + eps_c) |S^_t| |G_t|]
    dg_t    = sum_c y_c . Lam'_c:    sum_c (Ey_c |Lam'^_c| + |y^_c| Fp_c) + gamma_(d dv)
                                     sum |y^ * Lam'^|  (channel gates: per row m, |y^_mc|,
                                     |Lam'^_mc| and gamma_dv)
    dS_0    = D_1 Lam'_1 = C_0:      F^C_0 (the carried part's bound past the first token)
qk_l2norm: dx = (dxh - xh (xh . dxh)) / r for x = q or k, from dxh^ within e: |dx^_m -
dx_m| <= (1 + 4 eta) [e_m + |xh^_m| sum_i |xh^_i| e_i + (gamma_(d+3) + 4 eta) A_m] / r^, A_m
= |dxh^_m| + |xh^_m| sum_i |xh^_i| |dxh^_i| (xh^ and r^ within eta relatively; the
projection's d + 2 roundings and the division's).
Gradual underflow (outside the standard model): every product that may underflow adds
UNDERFLOW times the factors it is later multiplied by, and a subnormal exp(g) 2^-1072 times
what it multiplies (as delta.float64_delta).

Magnitudes: accuracy.delta_gradient.delta_gradient_magnitudes defines them, and the layer
contract (pyproject.toml, [tool.importlinter]) puts accuracy above reference: the caller
computes them.

The bound grows linearly in N where G_t = 1 (unit keys, beta in [0, 2], no decay), like
the magnitudes' own F and R terms (delta_gradient.py), so bound / M stays near (d + dv) u.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from ...inputs import AttentionInputs
from ...reference.certified import LIB, SAFETY, U64, UNDERFLOW, gamma64
from ...specs import RSQRT_D, Spec, SpecError
from .fields import QK_L2NORM_EPS
from .gradients import _inputs, _shapes
from .reference import MAX_TOKENS, SMALL_NORM

BLOCK = 64  # tokens per checkpoint of the forward (read at each call: tests shrink it)
SUBNORMAL_EXP = 2.0**-1072  # a subnormal exp(g)'s absolute error (2 ulps of 2^-1074)

Arrays = dict[str, np.ndarray]


def _norms(a: np.ndarray, rate: float, axis: int = -2) -> np.ndarray:
    """Upper bounds on the 2-norms of a along `axis` (kept): the computed norm times (1 +
    rate), or sqrt(n) max |a_i| (1 + rate) where squares may have underflowed."""
    norms = np.sqrt(np.sum(a * a, axis, keepdims=True))
    small = norms < SMALL_NORM
    if small.any():
        wide = math.sqrt(a.shape[axis]) * np.abs(a).max(axis=axis, keepdims=True)
        norms = np.where(small, np.maximum(wide, norms), norms)
    return norms * (1 + rate)


@dataclass(frozen=True)
class _Rates:
    """The relative error constants for head dimension d (module docstring)."""

    key: float  # eta: a normalised q or k's, elementwise (0 without qk_l2norm)
    knorm: float  # of the bounds K, Q on |k|, |k^| from the computed norm
    step: float  # gamma_(d+4) + eta_e
    scale: float  # eps_c
    gated: bool
    l2: bool

    @classmethod
    def of(cls, spec: Spec, d: int) -> _Rates:
        key = gamma64(d // 2 + 3) if spec.qk_l2norm else 0.0
        exp = LIB + U64 if spec.decay is not None else 0.0
        scale = LIB if spec.scale == RSQRT_D else 0.0
        return cls(key, gamma64(d + 1) + 2 * key, gamma64(d + 4) + exp, scale,
                   spec.decay is not None, spec.qk_l2norm)  # fmt: skip


@dataclass
class _Tokens:
    """The per-token inputs, token-major (N, BH, ...), and their bounds."""

    q: np.ndarray  # (N, BH, d): as the recurrence uses them (normalised with qk_l2norm)
    k: np.ndarray
    rq: np.ndarray | None  # (N, BH, 1): r^ of q and k (qk_l2norm)
    rk: np.ndarray | None
    v: np.ndarray  # (N, BH, dv)
    go: np.ndarray  # (N, BH, dv)
    beta: np.ndarray  # (N, BH, 1)
    f: np.ndarray | None  # (N, BH, 1 or d): exp(g)
    kn: np.ndarray  # (N, BH, 1): K
    qn: np.ndarray  # (N, BH, 1): Q
    top: np.ndarray  # (N, BH, 1): max exp(g) (1 + LIB), or 1
    spread: np.ndarray  # (N, BH, 1)


def _unit(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(a / r^, r^), r^ = fl(sqrt(|a|^2 + QK_L2NORM_EPS)) (delta._l2norm's values)."""
    r = np.sqrt(np.sum(a * a, -1, keepdims=True) + QK_L2NORM_EPS)
    return a / r, r


def _tokens(x: AttentionInputs, spec: Spec, go: np.ndarray, rates: _Rates) -> _Tokens:
    b_, h_, n, d = x.q.shape
    bh = b_ * h_

    def major(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a.reshape(bh, n, -1).transpose(1, 0, 2))

    q, k, v, g_out = (major(t) for t in (x.q, x.k, x.v, go))
    rq = rk = None
    if spec.qk_l2norm:
        (q, rq), (k, rk) = _unit(q), _unit(k)
    beta = major(x.beta)
    f = None if spec.decay is None else np.exp(major(x.decay))
    kn, qn = _norms(k, rates.knorm, -1), _norms(q, rates.knorm, -1)
    top = np.ones_like(beta) if f is None else f.max(-1, keepdims=True) * (1 + LIB)
    # |1 - beta |k|^2| for the exact |k|^2 within rates.knorm of the computed one (and d
    # subnormal units where its squares underflow)
    k2 = np.sum(k * k, -1, keepdims=True) * (1 + rates.knorm)
    ab = np.abs(beta)
    spread = np.abs(1 - beta * k2) + 2 * ab * k2 * rates.knorm + ab * d * 2.0**-1074
    spread = np.maximum(1.0, spread * (1 + 2 * U64))
    return _Tokens(q, k, rq, rk, v, g_out, beta, f, kn, qn, top, spread)


@dataclass
class _Forward:
    """One block's forward: y^, S^ (T, BH, d, dv), u^ (T, BH, dv), their bounds Ey, Eu, E
    (T, BH, dv), |y^| (T, BH, dv)."""

    y: np.ndarray
    u: np.ndarray
    s: np.ndarray
    ey: np.ndarray
    eu: np.ndarray
    e: np.ndarray
    ny: np.ndarray


def _forward_block(tk: _Tokens, rates: _Rates, lo: int, hi: int, state, err) -> _Forward:
    """Tokens lo .. hi - 1 from S^_(lo-1) = state (BH, d, dv) within err (BH, dv)."""
    k, v, beta = tk.k[lo:hi], tk.v[lo:hi], tk.beta[lo:hi]
    f = None if tk.f is None else tk.f[lo:hi]
    m, (bh, d, dv) = hi - lo, state.shape
    ys, ss = np.empty((m, bh, d, dv)), np.empty((m, bh, d, dv))
    us = np.empty((m, bh, dv))
    before = _norms(state, gamma64(d + 2))[None, :, 0]  # |S^_(lo-1)|
    for i in range(m):
        y = state if f is None else state * f[i][:, :, None]
        ys[i] = y
        u = v[i] - np.matmul(k[i][:, None, :], y)[:, 0]
        us[i] = u
        np.add(y, k[i][:, :, None] * (beta[i] * u)[:, None, :], out=ss[i])
        state = ss[i]
    kn, ab, top = tk.kn[lo:hi], np.abs(beta), tk.top[lo:hi]
    ny = _norms(ys, gamma64(d + 2))[:, :, 0]  # (T, BH, dv)
    prev = np.concatenate([before, _norms(ss[:-1], gamma64(d + 2))[:, :, 0]])
    av = np.abs(v)
    grows = 1 + ab * kn * kn
    local = rates.step * (ny * grows + ab * kn * av) + 2 * rates.key * ab * kn * (kn * ny + av)
    local += UNDERFLOW * (d + 2) * (1 + kn) * (1 + ab * kn)
    if rates.gated:
        local += SUBNORMAL_EXP * prev * grows
    if rates.l2:  # a subnormal normalised key element
        local += UNDERFLOW * math.sqrt(d) * ab * (2 * kn * ny + av)
    local *= SAFETY
    grow = top * tk.spread[lo:hi]
    es, ey = np.empty((m, bh, dv)), np.empty((m, bh, dv))
    for i in range(m):
        ey[i] = top[i] * err if rates.gated else err
        err = grow[i] * err + local[i]
        es[i] = err
    if rates.gated:
        ey += (LIB + 2 * U64) * ny + math.sqrt(d) * UNDERFLOW + SUBNORMAL_EXP * prev
    ey *= SAFETY
    eu = gamma64(d + 1) * (av + kn * ny) + rates.key * kn * ny + kn * ey + d * UNDERFLOW
    if rates.l2:
        eu += math.sqrt(d) * UNDERFLOW * ny
    return _Forward(ys, us, ss, ey, eu * SAFETY, es, ny)


def _project(dxh, e, xh, r, eta: float) -> tuple[np.ndarray, np.ndarray]:
    """qk_l2norm's Jacobian on dxh^ (T, BH, d) within e: (dx^, its bound) (module docstring)."""
    d = xh.shape[-1]
    along = np.sum(xh * dxh, -1, keepdims=True)
    dx = (dxh - xh * along) / r
    ax = np.abs(xh)
    mag = np.abs(dxh) + ax * np.sum(ax * np.abs(dxh), -1, keepdims=True)
    spread = e + ax * np.sum(ax * e, -1, keepdims=True)
    bound = (1 + 4 * eta) * (spread + (gamma64(d + 3) + 4 * eta) * mag) / r
    tiny = UNDERFLOW * ((d + 2) + 2 * math.sqrt(d) * _norms(dxh, 0.0, -1)) / r + UNDERFLOW
    return dx, (bound + tiny) * SAFETY


def _mv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(..., d, dv) times (..., dv): (..., d)."""
    return np.matmul(a, b[..., None])[..., 0]


def _backward_block(tk: _Tokens, rates: _Rates, fw: _Forward, lo: int, hi: int, carry, fcarry,
                    c: float, grads: Arrays, bounds: Arrays):  # fmt: skip
    """The adjoint through tokens hi - 1 .. lo from C^_(hi-1) = carry (BH, d, dv) within
    fcarry (BH, dv), writing the block's gradients and bounds into grads and bounds;
    returns (C^_(lo-1), its bound) (module docstring)."""
    k, beta, go = tk.k[lo:hi], tk.beta[lo:hi], tk.go[lo:hi]
    cq = c * tk.q[lo:hi]
    f = None if tk.f is None else tk.f[lo:hi]
    m, (bh, d, dv) = hi - lo, carry.shape
    lams, lps = np.empty((m, bh, d, dv)), np.empty((m, bh, d, dv))
    kls = np.empty((m, bh, dv))
    for i in reversed(range(m)):
        lam = carry + cq[i][:, :, None] * go[i][:, None, :]
        lams[i] = lam
        kl = np.matmul(k[i][:, None, :], lam)[:, 0]
        kls[i] = kl
        np.subtract(lam, k[i][:, :, None] * (beta[i] * kl)[:, None, :], out=lps[i])
        carry = lps[i] if f is None else lps[i] * f[i][:, :, None]
    carry = carry.copy()
    kn, ab, top, spread = tk.kn[lo:hi], np.abs(beta), tk.top[lo:hi], tk.spread[lo:hi]
    nl = _norms(lams, gamma64(d + 2))[:, :, 0]  # (T, BH, dv)
    nlp = _norms(lps, gamma64(d + 2))[:, :, 0]
    ag = np.abs(go)
    inj = abs(c) * tk.qn[lo:hi] * ag * (rates.scale + rates.key + 2 * U64) + U64 * nl
    inj = (inj + math.sqrt(d) * UNDERFLOW * (1 + ag)) * SAFETY
    fp_own = (gamma64(d + 3) + 2 * rates.key) * (1 + ab * kn * kn) * nl
    fp_own = (fp_own + UNDERFLOW * (d + 2) * (1 + kn) * (1 + ab * kn)) * SAFETY
    carry_own = (LIB + 2 * U64) * top * nlp + math.sqrt(d) * UNDERFLOW + SUBNORMAL_EXP * nlp
    carry_own *= SAFETY
    big_f, big_fp = np.empty((m, bh, dv)), np.empty((m, bh, dv))
    for i in reversed(range(m)):
        big_f[i] = fcarry + inj[i]
        big_fp[i] = spread[i] * big_f[i] + fp_own[i]
        fcarry = top[i] * big_fp[i] + carry_own[i] if rates.gated else big_fp[i]
    ekl = kn * big_f + ((rates.key + gamma64(d)) * kn * nl + d * UNDERFLOW) * SAFETY
    ys, us, ss, ey, eu = fw.y, fw.u, fw.s, fw.ey, fw.eu
    sl = slice(lo, hi)
    au, akl, al, ay = np.abs(us), np.abs(kls), np.abs(lams), np.abs(ys)
    # dv = beta kl, dbeta = kl . u
    grad_v = beta * kls
    grads["v"][sl] = grad_v
    bounds["v"][sl] = (ab * ekl + U64 * np.abs(grad_v) + UNDERFLOW) * SAFETY
    grads["beta"][sl] = np.sum(kls * us, -1)
    e_beta = np.sum(ekl * au + (akl + ekl) * eu + gamma64(dv) * akl * au, -1) + dv * UNDERFLOW
    bounds["beta"][sl] = e_beta * SAFETY
    # dk = beta (Lam u - y kl), dq = c S G
    dkh = beta * (_mv(lams, us) - _mv(ys, kls))
    inner = np.sum(big_f * au + ey * akl, -1, keepdims=True) + _mv(al, eu) + _mv(ay, ekl)
    inner += gamma64(dv + 1) * (_mv(al, au) + _mv(ay, akl))
    ek = (ab * inner + U64 * np.abs(dkh) + UNDERFLOW * (2 * dv + 2) * (1 + ab)) * SAFETY
    dqh = c * _mv(ss, go)
    eq = np.sum(fw.e * ag, -1, keepdims=True) + (gamma64(dv + 1) + rates.scale) * _mv(
        np.abs(ss), ag
    )
    eq = (abs(c) * eq + UNDERFLOW * (dv + 1) * (1 + abs(c))) * SAFETY
    if rates.l2:
        dkh, ek = _project(dkh, ek, k, tk.rk[sl], rates.key)
        dqh, eq = _project(dqh, eq, tk.q[sl], tk.rq[sl], rates.key)
    grads["k"][sl], bounds["k"][sl] = dkh, ek
    grads["q"][sl], bounds["q"][sl] = dqh, eq
    # dg = sum y * Lam' (per row m for channel gates)
    alp = np.abs(lps)
    if f is not None and f.shape[-1] == 1:
        grads["g"][sl] = np.sum(ys * lps, (-2, -1))
        e_g = np.sum(ey * nlp + fw.ny * big_fp, -1)
        e_g += gamma64(d * dv) * np.sum(ay * alp, (-2, -1)) + d * dv * UNDERFLOW
        bounds["g"][sl] = e_g * SAFETY
    elif f is not None:
        grads["g"][sl] = np.sum(ys * lps, -1)
        e_g = _mv(alp, ey) + _mv(ay, big_fp) + gamma64(dv) * np.sum(ay * alp, -1)
        bounds["g"][sl] = (e_g + dv * UNDERFLOW) * SAFETY
    return carry, fcarry


def _heads(a: np.ndarray, b_: int, h_: int) -> np.ndarray:
    """(N, BH, ...) token-major to (B, H, N, ...)."""
    return np.moveaxis(a, 0, 1).reshape(b_, h_, *a.shape[:1], *a.shape[2:])


def certified_delta_gradients(
    x: AttentionInputs,
    spec: Spec,
    g_out: np.ndarray,
    g_state: np.ndarray | None = None,
    initial_state: np.ndarray | None = None,
) -> tuple[Arrays, Arrays]:
    """(grads, bounds): the delta rule's gradients of L = sum(o * g_out) (+ sum(S_N *
    g_state)) in float64, and a rigorous bound on each element's error, {name: array} with
    delta_grad.exact_delta_gradients' names and shapes (module docstring). The magnitudes
    are accuracy.delta_gradient.delta_gradient_magnitudes' (a layer above). SpecError for a
    spec that is not the delta rule's, inputs without beta, misshapen cotangents or state,
    or N >= delta.MAX_TOKENS. A non-finite bound (overflow) certifies nothing."""
    go, gs, s0 = _inputs(x, spec, g_out, g_state, initial_state)
    b_, h_, n, d = x.q.shape
    dv = x.v.shape[3]
    if n >= MAX_TOKENS:
        raise SpecError(f"the certified delta gradients take fewer than {MAX_TOKENS} tokens")
    shapes = _shapes(x, spec, initial_state is not None or g_state is not None)
    bh = b_ * h_
    rates = _Rates.of(spec, d)
    grads = {name: np.empty((n, bh, *shape[1:])) for name, shape in shapes.items() if name != "S0"}
    bounds = {name: np.empty_like(a) for name, a in grads.items()}
    with threadpool_limits(1, user_api="blas"), np.errstate(over="ignore", invalid="ignore"):
        tk = _tokens(x, spec, go, rates)
        size = max(1, min(BLOCK, n))
        starts = list(range(0, n, size))
        # the forward, keeping S^ and E at each block's start
        state = np.zeros((bh, d, dv)) if s0 is None else s0.reshape(bh, d, dv).copy()
        err = np.zeros((bh, dv))
        checkpoints = []
        for lo in starts:
            checkpoints.append((state, err))
            fw = _forward_block(tk, rates, lo, min(lo + size, n), state, err)
            state, err = fw.s[-1].copy(), fw.e[-1].copy()
        # the backward, block by block from the last, each block's forward recomputed
        carry = np.zeros((bh, d, dv)) if gs is None else gs.reshape(bh, d, dv).copy()
        fcarry = np.zeros((bh, dv))
        for lo, (state, err) in zip(reversed(starts), reversed(checkpoints), strict=True):
            hi = min(lo + size, n)
            fw = _forward_block(tk, rates, lo, hi, state, err)
            carry, fcarry = _backward_block(
                tk, rates, fw, lo, hi, carry, fcarry, spec.scale_for(d), grads, bounds
            )
    out = {name: _heads(a, b_, h_) for name, a in grads.items()}
    bnd = {name: _heads(a, b_, h_) for name, a in bounds.items()}
    if "S0" in shapes:  # dS_0 = C^_0 = fl(D_1 Lam'^_1), within its carried bound
        out["S0"] = carry.reshape(b_, h_, d, dv)
        bnd["S0"] = np.broadcast_to(fcarry[:, None, :], (bh, d, dv)).reshape(b_, h_, d, dv)
    return out, bnd
