"""Certified gradients at length: dL/dq, dL/dk, dL/dv (and dL/dg of the log-gates) of
L = sum(out * G) in float64 at matmul speed, O(N), each element with a rigorous bound on
its error, and the magnitudes M that reference/grad.py's gradient_magnitudes defines.

Covered: the unnormalised specs with identity features (simple GLA, retention, GLA):
causal, any scale c, decay None, "constant", "gates" or "channel-gates", where
out_i = c sum_(j<=i) w_ij (q_i . k_j) v_j; and non-causal (no decay: specs.py, a decay
needs a causal spec), out_i = c sum_j (q_i . k_j) v_j over all j ("Non-causal" below).
With b_ij = dL/dA_ij = G_i . v_j (grad.py, unnormalised) the gradients are decayed
linear-attention sums themselves:

    dv_j = c sum_(i>=j) w_ij (q_i . k_j) G_i,
    dq_i = c sum_(j<=i) w_ij (G_i . v_j) k_j,
    dk_j = c sum_(i>=j) w_ij (G_i . v_j) q_i,

dq a causal sum (left G, right v, columns k), dk and dv causal sums on the reversed
sequence: with j' = N-1-j, w_ij = exp(l'_(i'+1) + ... + l'_(j')) for the log-decays
l'_t' = l_(N-t') (l'_0 unused), so certified_decay.decayed_sums runs them as it runs the
forward. Channel gates (W_ijm = exp(G_im - G_jm) per key channel m) decay dv's q.k
features as the forward's, but dq's and dk's output channel: dq_im = c sum_j W_ijm (G_i .
v_j) k_jm, one causal sum per channel m with channel m's log-gates as scalar gates (and
dk_jm so, reversed). dL/dg: with p_ij = b_ij A_ij, sum_j p_sj = q_s . dq_s and sum_i p_is
= k_s . dk_s, so (grad.py) dL/dG_s = q_s . dq_s - k_s . dk_s (channel gates: q_sm dq_sm -
k_sm dk_sm), dL/dg_t = sum_(s>=t) dL/dG_s, and dL/dg_0 = 0 exactly (no key precedes
token 0).

Bounds. dq, dk, dv: decayed_sums' bound (certified_decay.py's module docstring: the
chunk form's weights within exp(gamma_e y) of w_ij, rho on each term's path, Higham 2002,
Lemma 3.1 and eq. 3.5; the H chain for the exponents' error; gradual underflow) holds for
any float64 left, right and columns: here exact inputs (identity features, psi = 0), then
the scale c, within LIB for RSQRT_D (certified._finish). dL/dg: each computed x^_s = fl(q_s
. dq^_s - k_s . dk^_s) is within e_s = |q_s| . E_dq,s + |k_s| . E_dk,s + gamma_(d+1)
(|q_s| . |dq^_s| + |k_s| . |dk^_s|) + 4 d SUBNORMAL of x_s (E the bounds of dq^, dk^; a dot
in any order, Higham eq. 3.5; its products may underflow), and the reverse cumulative sum of
N terms errs by gamma_N sum_(s>=t) |x^_s| (Lemma 3.1): |dg^_t - dg_t| <= (sum_(s>=t) e_s +
gamma_N sum_(s>=t) |x^_s|) / (1 - gamma_N), the sums of non-negative terms computed,
hence the division (and SAFETY for the bound's own roundings).

Magnitudes (grad.py's module docstring, unnormalised: D = 1, M(b_ij) = |G_i| . |v_j|):
M(dq_i) = c sum_j sigma_ij w_ij (|G_i| . |v_j|) |k_j|, M(dk_j) = c sum_i sigma_ij w_ij (|G_i|
. |v_j|) |q_i|, M(dv_j) = c sum_i sigma_ij w_ij (|q_i| . |k_j|) |G_i| (channel gates: W_ijm
per channel m), sigma_ij = 1 + M(ln w_ij): 1 without a decay, 1 + (i - j) |ln gamma| for
a constant one, 1 + 2 sum_(t<=i) |g_t| for gates, 1 + 2 max_m sum_(t<=i) |g_tm| for channel
gates; M(dg_t) = sum_(s>=t) (|q_s| . M(dq_s) + |k_s| . M(dk_s)) (per channel m for channel
gates), the evaluation through the prefix sums. They are chain sums of non-negative terms
in float64 (relative error about rho), the constant decay's (i - j) |ln gamma| by chunks of
CHUNK rows: in-chunk pairs directly, earlier keys through two states, sum_j gamma^(e-j)
|r_j| |x_j| and the same times (e - j) |ln gamma| (e the chunk's last row before), so that
(i - j) = (i - e) + (e - j) splits into non-negative parts.

Non-causal (grad.py with every key allowed, w_ij = 1, sigma_ij = 1): the same formulas with
every sum over all j (or all i), sum_j (l_i . r_j) x_j = l_i (sum_j r_j x_j^T), one total
per head. Each runs as one causal chain of decayed_sums (_total_run) on a sequence of 2N
tokens, the keys first and the queries after: token t < N carries (a zero left feature,
r_t, x_t), token N + i carries (l_i, a zero right feature, a zero column), and the gates
are 0 (every weight exactly 1, the exponents exactly 0: no exponent error). Row N + i's
causal sum is sum_(t<N) (l_i . r_t) x_t plus terms with a zero factor, exactly the non-
causal sum, and decayed_sums' bound holds for any float64 inputs (its depth counted for 2N
keys). The zero features: identity's and relu's of 0, exact; elu's of -inf (exp(-inf) = 0,
whose bound float_features gives as one UNDERFLOW, entering the bound as an absolute term
near 2^-1070 N m times the largest factors: negligible, and rigorous). A zero factor's
product is exactly 0 unless the other factor is infinite; then the bound is infinite too
(the chain H meets the infinite feature). Magnitudes: c |l_i| (sum_j |r_j| |x_j|^T) in
float64 (non-negative terms: relative error gamma_(N+m), below 1e-12 for the N tested).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from threadpoolctl import threadpool_limits

from ..inputs import AttentionInputs
from ..specs import RSQRT_D, Spec, SpecError
from . import certified_decay as cd  # CHUNK, GROUP read at each call (tests shrink them)
from .certified import SAFETY, SUBNORMAL, _finish, gamma64
from .certified_decay import Factors, chain, decayed_sums
from .common import ReferenceAccuracyError
from .grad import _check_g_out, gradient_names

Arrays = dict[str, np.ndarray]


# The maps of the normalised specs covered (certified_grad_normalised.py): elementwise,
# non-negative features, so that every magnitude is a chain sum
NORMALISED_MAPS = ("elu", "relu")


# The Performer maps covered, causal (certified_grad_performer.py)
PROJECTED_MAPS = ("performer-positive", "performer-hyperbolic")


def covered(spec: Spec) -> bool:
    """Whether certified_gradients takes `spec`: not the delta rule, and either unnormalised
    with identity features, or normalised with elu or relu features (causal or not, any eps,
    scale and decay: a non-causal spec has none) or performer-positive or -hyperbolic
    features (causal)."""
    if spec.delta_rule:
        return False
    if spec.normalize:
        projected = spec.causal and spec.feature_map in PROJECTED_MAPS
        return spec.feature_map in NORMALISED_MAPS or projected
    return spec.feature_map == "identity"


def certified_gradients(
    x: AttentionInputs, spec: Spec, g_out: np.ndarray
) -> tuple[Arrays, Arrays, Arrays]:
    """(grads, bounds, magnitudes), each {name: array} for grad.gradient_names(spec) (q, k,
    v, and g for gates and channel gates, their shapes as exact_gradients'): the gradients
    of L = sum(out * g_out) in float64, a rigorous bound on each one's error, and the
    magnitudes M of grad.gradient_magnitudes (module docstring; M' for the normalised dq,
    dk and dg: certified_grad_normalised.py). SpecError for a spec `covered` refuses."""
    if not covered(spec):
        raise SpecError(
            f"certified gradients cover the unnormalised identity specs (simple GLA, "
            f"retention, GLA: decay None, constant, gates or channel-gates; or non-causal) and "
            f"the normalised elu and relu specs (causal or not, any eps, scale and decay) and "
            f"performer-positive and -hyperbolic ones (causal), not {spec}"
        )
    if np.array([SUBNORMAL]) * 1.0 == 0:  # the bounds assume gradual underflow
        raise ReferenceAccuracyError("flush-to-zero is on (torch.set_flush_denormal(True))")
    ga = _check_g_out(x, g_out)
    heads: list[list[tuple[Arrays, Arrays, Arrays]]] = []
    with threadpool_limits(1, user_api="blas"):
        for b in range(x.shape[0]):
            heads.append([])
            for h in range(x.shape[1]):
                decay = None
                if x.decay is not None:
                    decay = x.decay[h] if x.decay.ndim == 1 else x.decay[b, h]
                qkv = (x.q[b, h], x.k[b, h], x.v[b, h])
                heads[b].append(_head(*qkv, ga[b, h], decay, spec, x.projection))
    names = gradient_names(spec)
    return tuple(
        {name: np.array([[head[part][name] for head in row] for row in heads]) for name in names}
        for part in range(3)
    )


def _head(q, k, v, g_out, decay, spec: Spec, w=None) -> tuple[Arrays, Arrays, Arrays]:
    """One head's (grads, bounds, magnitudes) (module docstring; w: the Performer maps'
    projection)."""
    if spec.info.needs_projection:
        from .certified_grad_performer import performer_head

        return performer_head(q, k, v, g_out, decay, w, spec)
    if spec.normalize:
        from .certified_grad_normalised import normalised_head

        return normalised_head(q, k, v, g_out, decay, spec)
    if not spec.causal:
        return _total_head(q, k, v, g_out, spec)
    n, d = q.shape
    c = 1 / math.sqrt(d) if spec.scale == RSQRT_D else float(spec.scale)
    aq, ak, av, ag = (np.abs(t) for t in (q, k, v, g_out))
    grads, bounds, mags = {}, {}, {}
    if spec.decay == "channel-gates":
        spread = _spread(decay)[:, None]
        grads["v"], bounds["v"] = _sums(k, q, g_out, decay, spec, d, True)
        mags["v"] = c * _abs_sums(decay, ak, spread * aq, ag, True)
        scalar = replace(spec, decay="gates")  # channel m's log-gates as scalar gates
        for name in ("q", "k"):
            grads[name], bounds[name], mags[name] = (np.empty((n, d)) for _ in range(3))
        for m in range(d):
            at, gates, logs = slice(m, m + 1), decay[:, m], decay[:, m : m + 1]
            grads["q"][:, at], bounds["q"][:, at] = _sums(
                g_out, v, k[:, at], gates, scalar, d, False
            )
            grads["k"][:, at], bounds["k"][:, at] = _sums(
                v, g_out, q[:, at], gates, scalar, d, True
            )
            mags["q"][:, at] = c * spread * _abs_sums(logs, ag, av, ak[:, at], False)
            mags["k"][:, at] = c * _abs_sums(logs, av, spread * ag, aq[:, at], True)
    else:
        # no decay: gates of 0, every weight exactly 1
        scalar = spec if spec.decay else replace(spec, decay="gates")
        decay = np.zeros(n) if decay is None else decay
        grads["q"], bounds["q"] = _sums(g_out, v, k, decay, scalar, d, False)
        grads["k"], bounds["k"] = _sums(v, g_out, q, decay, scalar, d, True)
        grads["v"], bounds["v"] = _sums(k, q, g_out, decay, scalar, d, True)
        if spec.decay == "constant":
            log_gamma, spread = -math.log(float(decay)), 1.0

            def nonnegative(left, right, cols, backward):
                return _constant_abs_sums(log_gamma, left, right, cols, backward)

        else:
            logs = decay.reshape(n, 1)
            spread = _spread(logs)[:, None]

            def nonnegative(left, right, cols, backward):
                return _abs_sums(logs, left, right, cols, backward)

        mags["q"] = c * spread * nonnegative(ag, av, ak, False)
        mags["k"] = c * nonnegative(av, spread * ag, aq, True)
        mags["v"] = c * nonnegative(ak, spread * aq, ag, True)
    if spec.gated:
        channel = spec.decay == "channel-gates"
        grads["g"], bounds["g"], mags["g"] = gate_gradient(
            (q, k), (0.0, 0.0), grads, bounds, mags, channel
        )
    return grads, bounds, mags


def _total_head(q, k, v, g_out, spec: Spec) -> tuple[Arrays, Arrays, Arrays]:
    """One head's (grads, bounds, magnitudes) of a non-causal unnormalised identity spec:
    every sum over all tokens (module docstring, "Non-causal")."""
    d = q.shape[1]
    c = spec.scale_for(d)
    aq, ak, av, ag = (np.abs(t) for t in (q, k, v, g_out))
    grads, bounds, mags = {}, {}, {}
    # name: (left, right, columns) of c sum_j (left_i . right_j) cols_j
    for name, (left, right, cols) in {
        "q": (g_out, v, k),
        "k": (v, g_out, q),
        "v": (k, q, g_out),
    }.items():
        value, total, magnitude = _total_run(left, right, cols, spec)
        grads[name], bounds[name], _ = _finish(value, total, magnitude, 0.0, 0.0, spec, d)
    mags["q"] = c * _total_abs_sums(ag, av, ak)
    mags["k"] = c * _total_abs_sums(av, ag, aq)
    mags["v"] = c * _total_abs_sums(ak, aq, ag)
    return grads, bounds, mags


# The input whose feature is exactly 0, per map (elu: exp(-inf) = 0)
_ZERO_FEATURE_INPUT = {"identity": 0.0, "relu": 0.0, "elu": -math.inf}


def _total_run(left, right, cols, spec: Spec):
    """(value, bound, magnitude bound) as decayed_sums gives them (columns: cols, then the
    ones' sum), non-causal: sum_j (phi(left_i) . phi(right_j)) [cols_j, 1] over all j, as
    row N_r + i of one causal chain over the right rows, then the left rows (module
    docstring, "Non-causal"), for the features of spec's map (identity, relu or elu)."""
    n, n_r = left.shape[0], right.shape[0]
    blank = _ZERO_FEATURE_INPUT[spec.feature_map]
    lefts = np.concatenate([np.full((n_r, left.shape[1]), blank), left])
    rights = np.concatenate([right, np.full((n, right.shape[1]), blank)])
    columns = np.concatenate([cols, np.zeros((n, cols.shape[1]))])
    causal = replace(spec, causal=True, decay="gates")  # gates of 0: every weight 1
    kept = [  # the query rows of each step: (value, bound, magnitude bound)
        tuple(part[max(n_r - start, 0) :] for part in parts)
        for start, stop, *parts in decayed_sums(
            lefts, rights, columns, None, np.zeros(n + n_r), causal
        )
        if stop > n_r
    ]
    return tuple(np.concatenate(p) for p in zip(*kept, strict=True))


def _total_abs_sums(left, right, cols) -> np.ndarray:
    """sum_j (left_i . right_j) cols_j over all j for non-negative float64 inputs."""
    return left @ (right.T @ cols)


def _flipped(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a[::-1])


def _flipped_logs(g: np.ndarray) -> np.ndarray:
    """The log-decays of the reversed sequence, l'_t' = l_(N-t') (l'_0 = 0, unused)."""
    return np.concatenate([np.zeros_like(g[:1]), g[::-1][:-1]])


def _sums(left, right, cols, decay, spec: Spec, d: int, backward: bool):
    """(c sum_(j<=i) w_ij (left_i . right_j) cols_j, its bound) by decayed_sums and
    certified._finish (c the scale at head dimension d); backward: sum_(j>=i) instead, on
    the reversed sequence."""
    if backward:
        left, right, cols = _flipped(left), _flipped(right), _flipped(cols)
        decay = decay if spec.decay == "constant" else _flipped_logs(decay)
    parts = list(zip(*decayed_sums(left, right, cols, None, decay, spec), strict=True))
    value, total, magnitude = (np.concatenate(p) for p in parts[2:])
    out, bound, _ = _finish(value, total, magnitude, 0.0, 0.0, spec, d)
    return (out[::-1], bound[::-1]) if backward else (out, bound)


def _spread(logs: np.ndarray) -> np.ndarray:
    """1 + 2 max_m sum_(t<=i) |g_tm| per row i: grad.py's bound on 1 + M(ln w_ij)."""
    return 1 + 2 * np.max(np.cumsum(np.abs(logs.reshape(logs.shape[0], -1)), axis=0), axis=1)


def _abs_sums(logs, left, right, cols, backward: bool) -> np.ndarray:
    """sum_(j<=i) sum_m left_im right_jm w_ijm cols_j (or j >= i, backward) for non-negative
    float64 inputs, w from the log-decays (N, 1) or (N, m): certified_decay.chain, streamed."""
    if backward:
        left, right, cols = _flipped(left), _flipped(right), _flipped(cols)
        logs = _flipped_logs(logs)
    n, step = left.shape[0], cd.CHUNK * cd.GROUP
    state, out = np.zeros((left.shape[1], cols.shape[1])), []
    for start in range(0, n, step):
        stop = min(start + step, n)
        f = Factors.of(np.pad(logs[start:stop], ((0, -(stop - start) % cd.CHUNK), (0, 0))))
        rows = slice(start, stop)
        part, state = chain(f, left[rows], right[rows], cols[rows], state)
        out.append(part)
    sums = np.concatenate(out)
    return sums[::-1] if backward else sums


def _constant_abs_sums(log_gamma: float, left, right, cols, backward: bool) -> np.ndarray:
    """sum_(j<=i) gamma^(i-j) (1 + (i-j) L) (left_i . right_j) cols_j (or j >= i, gamma^(j-i)
    (1 + (j-i) L), backward), L = -ln gamma, for non-negative inputs: by chunks of CHUNK
    rows (module docstring), every part non-negative."""
    if backward:
        left, right, cols = _flipped(left), _flipped(right), _flipped(cols)
    n, size = left.shape[0], cd.CHUNK
    lc, rc, xc = (
        np.pad(t, ((0, -n % size), (0, 0))).reshape(-1, size, t.shape[1])
        for t in (left, right, cols)
    )
    at = np.arange(size, dtype=np.float64) * log_gamma  # o L for the offsets o in a chunk
    apart = np.maximum(at[:, None] - at[None, :], 0.0)  # (i - j) L inside a chunk, j <= i
    inner = np.tril(np.exp(-apart) * (1 + apart))
    to_end = at[::-1]  # (e' - j) L, e' the chunk's last row
    own_a = np.matmul((rc * np.exp(-to_end)[:, None]).swapaxes(1, 2), xc)
    own_b = np.matmul((rc * (np.exp(-to_end) * to_end)[:, None]).swapaxes(1, 2), xc)
    whole, length = math.exp(-size * log_gamma), size * log_gamma
    before_a, before_b = np.empty_like(own_a), np.empty_like(own_b)
    state_a = state_b = np.zeros_like(own_a[0])
    for chunk in range(own_a.shape[0]):
        before_a[chunk], before_b[chunk] = state_a, state_b
        state_b = whole * (state_b + length * state_a) + own_b[chunk]
        state_a = whole * state_a + own_a[chunk]
    reach = at + log_gamma  # (i - e) L, e the last row before i's chunk
    pre = np.exp(-reach)[:, None]
    out = np.matmul(lc * (pre * (1 + reach[:, None])), before_a) + np.matmul(lc * pre, before_b)
    out += np.matmul(np.matmul(lc, rc.swapaxes(1, 2)) * inner, xc)
    sums = out.reshape(-1, cols.shape[1])[:n]
    return sums[::-1] if backward else sums


def gate_gradient(features, psi, grads: Arrays, bounds: Arrays, mags: Arrays, channel: bool):
    """(dL/dg, its bound, its magnitude) from the features (f_q, f_k) = (phi^(q), phi^(k)),
    their error bounds psi (0 for exact ones) and grads, bounds, mags of dL/dphi(q) and
    dL/dphi(k) under "q" and "k" (module docstring): the reverse cumulative sum of f_q .
    dphi(q) - f_k . dphi(k) (per channel for channel gates), 0 at token 0. A product
    f^ y^ of f^ within psi of f and y^ within E of y errs by (|f^| + psi) E + psi |y^|."""
    (q, k), (psi_q, psi_k) = features, psi
    dq, dk, eq, ek = grads["q"], grads["k"], bounds["q"], bounds["k"]
    aq, ak = np.abs(q), np.abs(k)
    with np.errstate(invalid="ignore"):  # inf bounds times 0 features: inf below
        terms = (aq + psi_q) * eq + (ak + psi_k) * ek + psi_q * np.abs(dq) + psi_k * np.abs(dk)
    if channel:
        width, x = 1, q * dq - k * dk
        err = terms + gamma64(2) * (aq * np.abs(dq) + ak * np.abs(dk))
        mag = aq * mags["q"] + ak * mags["k"]
    else:
        width, x = q.shape[1], np.sum(q * dq, axis=1) - np.sum(k * dk, axis=1)
        err = np.sum(terms, axis=1)
        err += gamma64(width + 1) * np.sum(aq * np.abs(dq) + ak * np.abs(dk), axis=1)
        mag = np.sum(aq * mags["q"] + ak * mags["k"], axis=1)
    err = np.where(np.isnan(err), np.inf, err)
    n = x.shape[0]
    # products that may underflow: none where every product has an exact zero factor
    active = ((aq != 0) & (dq != 0)) | ((ak != 0) & (dk != 0)) | (terms > 0)
    active = active if channel else np.any(active, axis=1)
    err = err + 4 * width * SUBNORMAL * active

    def through(t: np.ndarray) -> np.ndarray:  # sum_(s>=t) t_s
        return np.cumsum(t[::-1], axis=0)[::-1]

    g = gamma64(n)
    with np.errstate(over="ignore", invalid="ignore"):
        bound = (through(err) + g * through(np.abs(x))) / (1 - g) * SAFETY
    dg = through(x)
    dg[0], bound[0] = 0.0, 0.0
    bound[~np.isfinite(dg)] = np.inf
    return dg, bound, through(mag)
