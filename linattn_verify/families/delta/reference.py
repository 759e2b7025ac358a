"""The delta rule's references: mpmath and arb (exact), and a certified float64 engine.

Definition (families/delta/fields.py: DeltaNet, Gated DeltaNet, KDA), per batch b and head h, with
c the spec's scale (1/sqrt(d) exactly for RSQRT_D) and S_0 the initial state (d, dv) or 0:

    for t = 1 .. N:  S <- D_t S;  u_t = beta_t (v_t - S^T k_t);  S <- S + k_t u_t^T;
                     o_t = c S^T q_t

i.e. S_t = (I - beta_t k_t k_t^T) D_t S_(t-1) + beta_t k_t v_t^T, with D_t = exp(g_t) I
(gates), diag(exp(g_t)) (channel gates: row m of S times exp(g_tm)) or I. With qk_l2norm
q_t and k_t are first x / sqrt(|x|^2 + QK_L2NORM_EPS), computed exactly. beta is any real.

Normwise error model (shared by the three engines). Each value column x = S[:, c] evolves
on its own, x_t = A_t x_(t-1) + beta_t k_t v_tc, A_t = (I - beta_t k_t k_t^T) D_t, whose
2-norm is at most G_t = max_m D_tm max(1, |1 - beta_t |k_t|^2|) (I - beta k k^T has the
eigenvalues 1 and 1 - beta |k|^2). A computed state x^_t = A_t x^_(t-1) + b_t + r_t, r_t
the local error of the step, errs by E_t = A_t E_(t-1) + r_t, so |E_t| <= G_t |E_(t-1)| +
|r_t|: a running scalar per column. A componentwise bound by absolute values (ball
arithmetic's radii) grows like (1 + |beta| |k|^2)^N where G_t is 1: it judges nothing.

- mp (`mp_delta`): the literal recurrence in mpmath at p and 2p bits, with a first-order
  estimate of the above at 2p (gamma_n as n 2^-2p); elements accepted where the two agree
  within one ulp and the estimate is below 2^-64 of the value (mp._settled), else p doubles,
  up to MAX_PREC (ReferenceAccuracyError). Also the final state, likewise.
- arb (`arb_delta`): the same recurrence in balls (Johansson 2017, "Arb"), recentred at
  every token: the step is evaluated in balls from the exact midpoint state, so that the
  ball contains A_t x^_(t-1) + b_t and its radii bound r_t rigorously; the state goes on
  as the midpoints, with |E_t| carried as above. An element is accepted where its ball
  (plus |c| |q_t| |E_t|) decides its nearest float64, else the precision doubles: correct
  rounding, so that it agrees bit for bit with mpmath. `arb_delta_decimal`: the same balls
  decided to a number of decimal digits (the known-answer vectors' 34).
- float64 (`float64_delta`, `certified_delta`): see `float64_delta`.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import mpmath
import numpy as np
from flint import arb, arb_mat
from threadpoolctl import threadpool_limits

from ...inputs import AttentionInputs, as_float64
from ...reference.arb import decimal_text
from ...reference.balls import balls, working_precision
from ...reference.certified import CERTIFIED_SHARE, LIB, SAFETY, U64, UNDERFLOW, Certified, gamma64
from ...reference.common import MAX_PREC, ReferenceAccuracyError, decided, resolve_recurrence
from ...reference.mp import DEFAULT_PREC as MP_PREC
from ...reference.mp import _settled, nearest
from ...specs import RSQRT_D, Spec, SpecError
from .fields import QK_L2NORM_EPS

ARB_PREC = 128
# Largest B*H*N*d*dv (the recurrence's multiplications) for which exact_delta_state and
# reference.exact's "auto" use mpmath, the literal recurrence (up to ~10 ms); arb is about
# ten times faster at every size (measured from 1 to 512 on the 2-core machine)
MP_MAX_STEPS = 2**6
BLOCK = 64  # tokens per block of the float64 engine: its states are buffered, then bounded
# A contraction block (see float64_delta) closes once its transition's norm is at most this
RHO_CLOSE = 0.5
SQUARINGS = 3  # of the transition, for its 2-norm (_transition_norm): d^(1/16) at most
# The bound's own recurrence (E <- G E + |r|, G rounded) may fall short by a relative 8u per
# token: within SAFETY's 2^-20 below this many tokens (8 2^24 u = 2^-26)
MAX_TOKENS = 2**24
SCALE_FLOOR = 2.0**-1000  # delta_scale's least value: u s stays a nonzero float64 for u >= 2^-53
SMALL_NORM = 2.0**-500  # below it, squares in a norm may underflow: bound by sqrt(d) max |x|


def checked_initial_state(x: AttentionInputs, spec: Spec, initial_state) -> np.ndarray | None:
    """SpecError unless the spec is the delta rule's and x carries beta; the initial state
    (B, H, d, dv) as an exact float64 array, or None."""
    if not spec.delta_rule or x.beta is None:
        raise SpecError(f"the delta-rule engines are for delta-rule specs with beta, not {spec}")
    if initial_state is None:
        return None
    s0, _ = as_float64(initial_state, "initial_state")
    want = (*x.q.shape[:2], x.q.shape[3], x.v.shape[3])
    if s0.shape != want:
        raise SpecError(f"initial_state must have shape {want} (B, H, d, dv), got {s0.shape}")
    return s0


def log_gate_rows(x: AttentionInputs, spec: Spec, b: int, h: int) -> list | None:
    """Per token, the d log-gates of D_t's rows (a gate repeated d times), or None."""
    if spec.decay is None:
        return None
    g = x.decay[b, h]
    d = x.q.shape[3]
    return g.tolist() if g.ndim == 2 else [[t] * d for t in g.tolist()]


def _estimate_roundings(spec: Spec, d: int) -> tuple[int, int]:
    """(n for a step, n for an output): the roundings of the local error and of o_t, for
    mp's first-order estimate: the dot product, difference, product with beta, update and
    sum (d + 4), the gate's exp (2), each normalisation of q or k (d + 3, twice in a step:
    k enters A_t and the injected term)."""
    l2 = d + 3 if spec.qk_l2norm else 0
    return d + 4 + 2 * (spec.decay is not None) + 2 * l2, d + 2 + l2


# ---------------------------------------------------------------------------- mpmath


def _mp_l2norm(a: list) -> list:
    mp = mpmath.mp
    scale = 1 / mp.sqrt(mp.fdot(a, a) + mp.mpf(QK_L2NORM_EPS))
    return [t * scale for t in a]


def _mp_head(x: AttentionInputs, spec: Spec, b: int, h: int, last: int, prec: int, s0):
    """Head (b, h) through token `last` at `prec` bits: (outputs (last + 1, dv), their
    error estimates, S (d, dv), its estimates), all rounded to float64 (module docstring)."""
    d, dv = x.q.shape[3], x.v.shape[3]
    qs, ks, vs = (t[b, h].tolist() for t in (x.q, x.k, x.v))
    betas, gates = x.beta[b, h].tolist(), log_gate_rows(x, spec, b, h)
    n_step, n_out = _estimate_roundings(spec, d)
    out, est = np.empty((last + 1, dv)), np.empty((last + 1, dv))
    with mpmath.workprec(prec):
        mp = mpmath.mp
        unit = mp.ldexp(1, -prec)
        c = 1 / mp.sqrt(d) if spec.scale == RSQRT_D else mp.mpf(spec.scale)
        rows = [[0.0] * dv] * d if s0 is None else s0[b, h].tolist()
        state = [[mp.mpf(t) for t in row] for row in rows]
        err = [mp.zero] * dv
        for t in range(last + 1):
            q, k = [mp.mpf(a) for a in qs[t]], [mp.mpf(a) for a in ks[t]]
            if spec.qk_l2norm:
                q, k = _mp_l2norm(q), _mp_l2norm(k)
            factors = None if gates is None else [mp.exp(g) for g in gates[t]]
            y = state if factors is None else [[f * a for a in r] for f, r in zip(factors, state)]
            beta, v = mp.mpf(betas[t]), [mp.mpf(a) for a in vs[t]]
            before = list(zip(*y))
            u = [beta * (v[col] - mp.fdot(k, before[col])) for col in range(dv)]
            state = [[a + km * uc for a, uc in zip(r, u)] for km, r in zip(k, y)]
            k2 = mp.fdot(k, k)
            grow = (max(factors) if factors else 1) * max(1, abs(1 - beta * k2))
            after, qn = list(zip(*state)), mp.sqrt(mp.fdot(q, q))
            for col in range(dv):
                ny = mp.sqrt(mp.fdot(before[col], before[col]))
                local = ny * (1 + abs(beta) * k2) + abs(beta) * mp.sqrt(k2) * abs(v[col])
                err[col] = grow * err[col] + n_step * unit * local
                xn = mp.sqrt(mp.fdot(after[col], after[col]))
                out[t, col] = nearest(c * mp.fdot(q, after[col]))
                est[t, col] = nearest(c * qn * (err[col] + n_out * unit * xn))
        final = np.array([[nearest(a) for a in r] for r in state])
        final_est = np.array([[nearest(e) for e in err]] * d)
    return out, est, final, final_est


def mp_delta(
    x: AttentionInputs,
    spec: Spec,
    initial_state: np.ndarray | None = None,
    state: bool = False,
    prec: int = MP_PREC,
    max_prec: int = MAX_PREC,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(o (B, H, N, dv), S_N (B, H, d, dv) if `state` else None), faithfully rounded to
    float64, by the literal recurrence in mpmath (module docstring)."""
    s0 = checked_initial_state(x, spec, initial_state)
    runs: dict[tuple[int, int], tuple] = {}  # (b, h) -> its last run, at the higher bits

    def solve(b: int, h: int, rows: list[int], p: int, need: bool):
        last = x.q.shape[2] - 1 if need else max(rows)
        low = _mp_head(x, spec, b, h, last, p, s0) if p == prec else runs[b, h]
        high = runs[b, h] = _mp_head(x, spec, b, h, last, 2 * p, s0)
        done = _settled(low[0][rows], high[0][rows], high[1][rows])
        final = high[2] if need and np.all(_settled(low[2], high[2], high[3])) else None
        return high[0][rows], done, final

    return resolve_recurrence(
        x.q.shape, x.v.shape, solve, prec, max_prec // 2, "mpmath engine (delta rule)", state
    )


# ---------------------------------------------------------------------------- arb


def _arb_l2norm(a: arb_mat, row: bool) -> arb_mat:
    square = (a * a.transpose() if row else a.transpose() * a)[0, 0]
    return a * (square + arb(QK_L2NORM_EPS)).rsqrt()


def _arb_head(
    x: AttentionInputs,
    spec: Spec,
    b: int,
    h: int,
    last: int,
    prec: int,
    s0,
    need: bool,
    decide: Callable[[arb], str | None] | None = None,
):
    """Head (b, h) through token `last` at `prec` bits: (outputs (last + 1, dv), S (d, dv)
    or None unless `need`), NaN where a ball does not decide the float64 (module docstring);
    with `decide`, the outputs are what it makes of their balls (an object array)."""
    d, dv = x.q.shape[3], x.v.shape[3]
    gates = log_gate_rows(x, spec, b, h)
    out = np.empty((last + 1, dv), dtype=object if decide else np.float64)
    decide = decide or decided
    with working_precision(prec):
        c = arb(d).rsqrt() if spec.scale == RSQRT_D else arb(spec.scale)
        state = arb_mat(d, dv) if s0 is None else arb_mat(balls(s0[b, h]))
        err = [arb(0)] * dv
        ones, one = arb_mat([[1] * d]), arb(1)
        for t in range(last + 1):
            k = arb_mat(balls(x.k[b, h, t][:, None]))
            q = arb_mat(balls(x.q[b, h, t][None, :]))
            if spec.qk_l2norm:
                k, q = _arb_l2norm(k, False), _arb_l2norm(q, True)
            top = one
            y = state
            if gates is not None:
                factors = [arb(g).exp() for g in gates[t]]
                rows = state.tolist()
                y = arb_mat([[f * a for a in r] for f, r in zip(factors, rows, strict=True)])
                top = arb(max(gates[t])).exp()
            beta = arb(x.beta[b, h, t])
            u = (arb_mat(balls(x.v[b, h, t][None, :])) - k.transpose() * y) * beta
            ball = y + k * u  # contains A_t S + beta k v^T for the exact midpoints S
            state = ball.mid()
            radii = (ones * (ball - state)).tolist()[0]  # each >= the column's |r|_1
            k2 = (k.transpose() * k)[0, 0]
            spread = (one - beta * k2).abs_upper()
            grow = arb((top * (spread if spread > one else one)).upper())
            err = [arb((grow * e + r.abs_upper()).upper()) for e, r in zip(err, radii, strict=True)]
            qn = (q * q.transpose())[0, 0].sqrt()
            o = ((q * state) * c).tolist()[0]
            for col, (a, e) in enumerate(zip(o, err, strict=True)):
                out[t, col] = decide(a + arb(0, (c * qn * e).upper()))
        if not need:
            return out, None
        final = [[decided(arb(a.mid(), e)) for a, e in zip(r, err)] for r in state.tolist()]
    return out, np.array(final)


def arb_delta(
    x: AttentionInputs,
    spec: Spec,
    initial_state: np.ndarray | None = None,
    state: bool = False,
    prec: int = ARB_PREC,
    max_prec: int = MAX_PREC,
    pending: dict[tuple[int, int], list[int]] | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(o (B, H, N, dv), S_N (B, H, d, dv) if `state` else None), correctly rounded to
    float64, in ball arithmetic (module docstring); only the rows `pending` of the heads it
    names, if given (NaN elsewhere)."""
    s0 = checked_initial_state(x, spec, initial_state)

    def solve(b: int, h: int, rows: list[int], p: int, need: bool):
        last = x.q.shape[2] - 1 if need else max(rows)
        out, final = _arb_head(x, spec, b, h, last, p, s0, need)
        values = out[rows]
        final = None if final is None or np.isnan(final).any() else final
        return values, ~np.isnan(values).any(axis=1), final

    return resolve_recurrence(
        x.q.shape, x.v.shape, solve, prec, max_prec, "arb engine (delta rule)", state, pending
    )


def arb_delta_decimal(
    x: AttentionInputs, spec: Spec, digits: int, max_prec: int = MAX_PREC
) -> np.ndarray:
    """The output (B, H, N, dv) as decimal strings of `digits` significant digits, correctly
    rounded (arb.decimal_text: both ends of the ball of arb_delta's recurrence, its carried
    error included, round to the same string), per head from 4 bits a digit, doubled until
    every element is decided; "0" where exactly 0. Known-answer vectors use 34 digits. A
    value that is 0 by cancellation (not exactly) never resolves: ReferenceAccuracyError."""
    checked_initial_state(x, spec, None)
    b_, h_, n = x.q.shape[:3]
    out = np.empty(x.v.shape, dtype=object)
    decide = functools.partial(decimal_text, digits=digits)
    for b, h in itertools.product(range(b_), range(h_)):
        prec = 4 * digits
        texts, _ = _arb_head(x, spec, b, h, n - 1, prec, None, False, decide)
        while any(t is None for t in texts.flat):
            if 2 * prec > max_prec:
                raise ReferenceAccuracyError(
                    f"arb engine (delta rule): head ({b}, {h}) not resolved to {digits} digits "
                    f"within {max_prec} bits"
                )
            prec *= 2
            texts, _ = _arb_head(x, spec, b, h, n - 1, prec, None, False, decide)
        out[b, h] = texts
    return out


def exact_delta_state(
    x: AttentionInputs, spec: Spec, initial_state: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(o (B, H, N, dv), S_N (B, H, d, dv)) in float64: by mpmath (within one ulp) for at
    most MP_MAX_STEPS multiplications, else by arb (the nearest float64)."""
    b_, h_, n, d = x.q.shape
    engine = mp_delta if b_ * h_ * n * d * x.v.shape[3] <= MP_MAX_STEPS else arb_delta
    return engine(x, spec, initial_state, state=True)


# ---------------------------------------------------------------------------- float64


@dataclass(frozen=True)
class DeltaFloat64:
    """float64_delta's result: o (B, H, N, dv), a bound on each element's absolute error,
    the scale (delta_scale), S_N (B, H, d, dv) and a bound on |S_N[:, c] - exact|_2 (B, H, dv)."""

    values: np.ndarray
    bound: np.ndarray
    scale: np.ndarray
    state: np.ndarray
    state_bound: np.ndarray


def delta_scale(q: np.ndarray, column_norms: np.ndarray, c: float) -> np.ndarray:
    """s_tc = |c| |q_t|_2 max_(j <= t) |S_j[:, c]|_2 (..., N, dv), the largest magnitude of
    state column c that row t's computation passed through, times the query's; at least
    SCALE_FLOOR (rows that are exactly 0). q (..., N, d) as the recurrence uses it (after
    qk_l2norm), column_norms (..., N, dv) those of S_1 .. S_N (fold S_0's in with np.maximum)."""
    largest = np.maximum.accumulate(column_norms, axis=-2)
    qn = np.sqrt(np.sum(q * q, axis=-1, keepdims=True))
    return np.fmax(abs(c) * qn * largest, SCALE_FLOOR)


@dataclass(frozen=True)
class _Rates:
    """The engine's relative error constants for head dimension d (float64_delta)."""

    step: float  # a step's, per unit of |y| (1 + |beta| |k|^2) + |beta| |k| |v|
    key: float  # a normalised q or k's, elementwise: gamma_(d/2 + 3) (0 without qk_l2norm)
    k2: float  # the computed |k|^2's
    out: float  # an output's, per unit of |c| |q| |x|
    scale: float  # the computed c's

    @classmethod
    def of(cls, spec: Spec, d: int) -> _Rates:
        key = gamma64(d // 2 + 3) if spec.qk_l2norm else 0.0
        exp = LIB + U64 if spec.decay is not None else 0.0
        scale = LIB if spec.scale == RSQRT_D else 0.0
        step = gamma64(d + 4) + exp
        return cls(step, key, gamma64(d + 1) + 2 * key, gamma64(d + 2) + key + scale, scale)


def _norms(a: np.ndarray, rate: float) -> np.ndarray:
    """Upper bounds on the 2-norms of a's columns (axis -2): the computed norm times
    (1 + rate), or sqrt(d) max |a_m| where squares may have underflowed."""
    norms = np.sqrt(np.einsum("...dw,...dw->...w", a, a)) * (1 + rate)
    small = norms < SMALL_NORM
    if small.any():
        wide = math.sqrt(a.shape[-2]) * np.abs(a).max(axis=-2) * (1 + 2 * U64)
        norms = np.where(small, wide, norms)
    return norms


def _l2norm(a: np.ndarray) -> np.ndarray:
    return a / np.sqrt(np.sum(a * a, -1, keepdims=True) + QK_L2NORM_EPS)


def float64_delta(
    x: AttentionInputs, spec: Spec, initial_state: np.ndarray | None = None
) -> DeltaFloat64:
    """o in float64 with a rigorous bound on each element's error (DeltaFloat64): the
    recurrence token by token, all heads at once, the bounds per BLOCK of tokens. Standard
    model (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., Lemma 3.1 and
    eq. 3.5: gamma_n; Lemma 3.3 to combine them), first-order terms (the second-order ones
    are below SAFETY's slack), numpy's exp within LIB (as certified.py), |.| the 2-norm.

    Local error of a step on column x, y = D_t x^_(t-1) (module docstring; |y| taken as
    max_m exp(g_tm) |x^_(t-1)|):
        |r_t| <= (gamma_(d+4) + eta_e) (|y| (1 + |beta| |k|^2) + |beta| |k| |v_tc|)
                 + 2 eta_k |beta| |k| (|k| |y| + |v_tc|)
    eta_e = LIB + u for exp(g) (0 without a decay), eta_k = gamma_(d/2+3) the elementwise
    error of a normalised key (its squares' sum gamma_(d+1), halved by the square root, the
    root and the division; 0 without qk_l2norm), plus underflow: UNDERFLOW per product,
    2^-1072 |x^_(t-1)| for a subnormal exp(g). Output:
        |o^_tc - o_tc| <= |c| (1 + eps_c) (|q| E_t + (gamma_(d+2) + eta_k + eps_c) |q| |x^_t|)
    eps_c = LIB for c = d^-0.5 (0 for a given scale), plus underflow.

    E_t <= G_t E_(t-1) + |r_t| grows linearly where G_t = 1 (no decay, keys of norm <= 1),
    although products of the A_t contract (the Kaczmarz iteration's convergence). So d more
    state columns carry the transition P = A_t ... A_(s+1) since a block start s (as state
    columns with v = 0, their errors bounded alike); at each BLOCK end rho >= |P_exact|_2
    (_transition_norm) and, once rho <= RHO_CLOSE, E <= min(E, rho E_s + W), W the errors
    committed since s carried by the same recurrence from 0; then P restarts at I.
    """
    s0 = checked_initial_state(x, spec, initial_state)
    b_, h_, n, d = x.q.shape
    dv = x.v.shape[3]
    if n >= MAX_TOKENS:
        raise SpecError(f"the float64 delta engine takes fewer than {MAX_TOKENS} tokens, got {n}")
    bh, w = b_ * h_, dv + d
    rates = _Rates.of(spec, d)
    c = spec.scale_for(d)
    tokens = [t.reshape(bh, n, -1) for t in (x.q, x.k, x.v)]
    beta = x.beta.reshape(bh, n)
    gates = None if x.decay is None else x.decay.reshape(bh, n, -1)  # (bh, n, 1 or d)
    state = np.zeros((bh, d, w))
    if s0 is not None:
        state[..., :dv] = s0.reshape(bh, d, dv)
    state[..., dv:] = np.eye(d)
    previous = _norms(state, gamma64(d + 2))  # (bh, w)
    largest = previous[:, :dv].copy()
    ew = np.zeros((bh, w + dv))  # E of every column, then W of the value columns
    start = np.zeros((bh, dv))  # E at the block start
    values, bound, scale = (np.empty((bh, n, dv)) for _ in range(3))
    size = min(BLOCK, n)
    states = np.empty((size, bh, d, w))
    history = np.empty((size, bh, w + dv))
    # a growing state may overflow: its bounds are then inf or NaN, and arb settles its rows
    with threadpool_limits(1, user_api="blas"), np.errstate(over="ignore", invalid="ignore"):
        for first in range(0, n, size):
            stop = min(first + size, n)
            qb, kb, vb = (t[:, first:stop].transpose(1, 0, 2) for t in tokens)
            if spec.qk_l2norm:
                qb, kb = _l2norm(qb), _l2norm(kb)
            bb = beta[:, first:stop].T[..., None]  # (T, bh, 1)
            eb = None if gates is None else np.exp(gates[:, first:stop].transpose(1, 0, 2))
            m = stop - first
            _run(state, kb, vb, bb, eb, states[:m])
            norms = _norms(states[:m], gamma64(d + 2))  # (T, bh, w)
            before = np.concatenate([previous[None], norms[:-1]])
            ny = before if eb is None else before * eb.max(-1, keepdims=True) * (1 + U64)
            local = _local(rates, spec, kb, vb, bb, ny, before, eb is not None)
            carried = np.concatenate([local, local[..., :dv]], -1)
            grow = _growth(rates, kb, bb, eb)
            for i in range(m):  # E and W, token by token
                np.multiply(history[i - 1] if i else ew, grow[i], out=history[i])
                history[i] += carried[i]
            ew = history[m - 1].copy()
            xs = states[:m, ..., :dv]
            values[:, first:stop] = (np.einsum("tbd,tbdc->tbc", qb, xs) * c).transpose(1, 0, 2)
            total = _output_bound(rates, spec, qb, history[:m, :, :dv], norms[..., :dv], c)
            bound[:, first:stop] = total.transpose(1, 0, 2)
            folded = np.maximum(norms[..., :dv], largest).transpose(1, 0, 2)
            scale[:, first:stop] = delta_scale(qb.transpose(1, 0, 2), folded, c)
            largest = np.maximum(largest, norms[..., :dv].max(axis=0))
            state = states[m - 1].copy()
            previous = norms[-1].copy()
            start = _close(state, ew, start, previous, dv)
    values, bound, scale = (t.reshape(b_, h_, n, dv) for t in (values, bound, scale))
    final = state[..., :dv].reshape(b_, h_, d, dv)
    return DeltaFloat64(values, bound, scale, final, (ew[:, :dv] * SAFETY).reshape(b_, h_, dv))


def _run(state, kb, vb, bb, eb, states) -> None:
    """The recurrence over a block's tokens, in place into states (T, bh, d, w): the value
    columns take v, the transition's columns 0."""
    dv = vb.shape[-1]
    for i in range(kb.shape[0]):
        y = state if eb is None else state * eb[i][:, :, None]
        s = np.matmul(kb[i][:, None, :], y)[:, 0]  # (bh, w): k^T y
        s[:, :dv] -= vb[i]
        s *= -bb[i]  # u = beta (v - k^T y), 0 - beta k^T y for P's columns
        np.add(y, kb[i][:, :, None] * s[:, None, :], out=states[i])
        state = states[i]


def _local(rates: _Rates, spec: Spec, kb, vb, bb, ny, before, gated: bool) -> np.ndarray:
    """Bounds on the local errors |r_t| (T, bh, w) of a block's steps (float64_delta)."""
    d = kb.shape[-1]
    kn = np.sqrt(np.sum(kb * kb, -1, keepdims=True)) * (1 + rates.k2)
    ab = np.abs(bb)
    av = np.concatenate([np.abs(vb), np.zeros((*vb.shape[:2], d))], -1)
    grows = 1 + ab * kn * kn
    local = rates.step * (ny * grows + ab * kn * av) + 2 * rates.key * ab * kn * (kn * ny + av)
    local += UNDERFLOW * (d + 2) * (1 + kn) * (1 + ab * kn)
    if gated:  # a subnormal exp(g) errs by up to 2^-1074, absolutely
        local += 2.0**-1072 * before * grows
    if spec.qk_l2norm:  # a subnormal normalised key element
        local += UNDERFLOW * math.sqrt(d) * ab * (2 * kn * ny + av)
    return local * SAFETY


def _transition_norm(p: np.ndarray, off: np.ndarray) -> np.ndarray:
    """rho >= |P_exact|_2 per head, P^ (bh, d, d) the computed transition and off >= |P^ -
    P_exact|_F. With A_0 = P^ and A_(i+1) = A_i^T A_i computed, |A_i|_2 = |A_i^T A_i|_2^(1/2)
    <= (|A_(i+1)|_2 + gamma_d |A_i|_F^2)^(1/2) (a computed product is within gamma_d |A| |B|
    of its value, Higham, eq. 3.13), and |A_K|_2 <= |A_K|_F: a Frobenius norm over-counts
    the singular values by up to d^(1/2), after K squarings by d^(1/2^(K+1)) only."""
    d = p.shape[-1]
    g, g_sum, tiny = gamma64(d), 1 + gamma64(d * d + 2), d * d * UNDERFLOW
    powers = [p]
    for _ in range(SQUARINGS):
        powers.append(np.matmul(powers[-1].transpose(0, 2, 1), powers[-1]))
    # upper bounds on the Frobenius norms (squares may underflow: d 2^-537 more)
    fro = [np.sqrt(np.einsum("bij,bij->b", a, a)) * g_sum + d * 2.0**-537 for a in powers]
    norm = fro[-1]
    for f in reversed(fro[:-1]):
        norm = np.sqrt((norm + g * f * f + tiny) * g_sum)
    return (norm + off) * SAFETY


def _growth(rates: _Rates, kb, bb, eb) -> np.ndarray:
    """G_t >= |A_t|_2 (T, bh, 1): max_m exp(g_tm) max(1, |1 - beta_t |k_t|^2|), |k_t|^2 as
    computed within rates.k2."""
    k2 = np.sum(kb * kb, -1, keepdims=True) * (1 + rates.k2)
    spread = np.abs(1 - bb * k2) + 2 * np.abs(bb) * k2 * rates.k2
    top = 1.0 if eb is None else eb.max(-1, keepdims=True) * (1 + LIB)
    return top * np.maximum(1.0, spread)


def _output_bound(rates: _Rates, spec: Spec, qb, err, norms, c: float) -> np.ndarray:
    """Bounds on the outputs' errors (T, bh, dv) from E_t and |x^_t| (float64_delta)."""
    d = qb.shape[-1]
    qn = np.sqrt(np.sum(qb * qb, -1, keepdims=True))
    total = qn * (err + (rates.out + UNDERFLOW * math.sqrt(d) * spec.qk_l2norm) * norms)
    total = (total + UNDERFLOW * (d + 1)) * abs(c) * (1 + rates.scale) + UNDERFLOW
    return total * SAFETY


def _close(state, ew, start, previous, dv: int) -> np.ndarray:
    """At a block end: for heads whose transition's bound rho is at most RHO_CLOSE, E <=
    min(E, rho E_s + W), and P, its bound and W restart (in place); returns E_s."""
    d = state.shape[1]
    off = np.sqrt(np.sum(ew[:, dv : dv + d] ** 2, -1)) * (1 + gamma64(d + 2))
    rho = _transition_norm(state[..., dv:], off)
    close = rho <= RHO_CLOSE
    if not close.any():
        return start
    e = np.minimum(ew[close, :dv], rho[close, None] * start[close] + ew[close, dv + d :])
    ew[close, :dv] = e
    ew[close, dv:] = 0.0
    state[close, :, dv:] = np.eye(d)
    previous[close, dv:] = 1.0
    start = start.copy()
    start[close] = e
    return start


def certified_delta(
    x: AttentionInputs, spec: Spec, initial_state: np.ndarray | None = None
) -> Certified:
    """The delta rule's output within CERTIFIED_SHARE s of the exact value, element by element
    (s: delta_scale): float64_delta's, and arb's (correctly rounded) for the rows where some
    bound is above CERTIFIED_SHARE s."""
    raw = float64_delta(x, spec, initial_state)
    values, bound = raw.values, raw.bound  # its own arrays: settled rows replace theirs
    ok = (raw.bound <= CERTIFIED_SHARE * raw.scale).all(axis=-1)  # (B, H, N); NaN fails
    pending = {(b, h): np.flatnonzero(~ok[b, h]).tolist() for b, h in zip(*np.nonzero(~ok.all(-1)))}
    if pending:
        exact, _ = arb_delta(x, spec, initial_state, pending=pending)
        for (b, h), rows in pending.items():
            values[b, h, rows] = exact[b, h, rows]
            bound[b, h, rows] = np.spacing(np.abs(exact[b, h, rows]))  # within one ulp
    return Certified(values, bound, raw.scale, sum(map(len, pending.values())))
