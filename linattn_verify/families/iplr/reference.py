"""The IPLR rule's references: mpmath and arb (exact, agreeing), and the scale.

Definition (family.py's IPLR_SOURCE; fla-core 0.6.0, fla/ops/generalized_delta_rule/iplr/
naive.py, iplr_recurrence, verified against it to float32 precision), per batch b and head
h, with c the spec's scale (1/sqrt(d) exactly for RSQRT_D) and S_0 the initial state (d, dv)
or 0:

    for t = 1 .. N:  w_t = a_t^T S;  S <- S + b_t w_t + k_t v_t^T;  o_t = c S^T q_t

i.e. S_t = (I + b_t a_t^T) S_(t-1) + k_t v_t^T (fla's Triton docstring writes the transposed
state, S_t = S_(t-1) (I + a_t b_t^T) + v_t k_t^T). a and b are any reals.

Normwise error model (shared by the two engines). Each value column x = S[:, c] evolves on
its own, x_t = M_t x_(t-1) + k_t v_tc, M_t = I + b_t a_t^T, whose 2-norm is rho_t =
sqrt(1 + lambda_t), lambda_t the larger eigenvalue of the 2 x 2 matrix C G (transition_norms:
M^T M - I = [a b] C [a b]^T, C = [[|b|^2, 1], [1, 0]], G the Gram matrix of a and b), 1 for
DeltaNet's I - beta k k^T with beta in [0, 2], at most 1 + |a| |b| always. A computed state
x^_t = M_t x^_(t-1) + k_t v_tc + r_t errs by E_t = M_t E_(t-1) + r_t, so |E_t| <= rho_t
|E_(t-1)| + |r_t|: a running scalar per column (ball arithmetic's componentwise radii would
grow like (1 + |a| |b|)^N instead).

- mp (`mp_iplr`): the literal recurrence in mpmath at p and 2p bits, with a first-order
  estimate of the above at 2p (gamma_n as n 2^-2p); rows accepted where the two agree within
  one ulp and the estimate is below 2^-64 of the value (reference.mp._settled: faithful
  rounding), else p doubles, up to MAX_PREC (ReferenceAccuracyError). Also the final state.
- arb (`arb_iplr`): the same recurrence in balls (Johansson 2017, "Arb"), recentred at every
  token: a step evaluated in balls from the exact midpoint state contains M_t x^_(t-1) +
  k_t v_tc, its radii bound r_t rigorously, and |E_t| is carried as above with rho_t's upper
  bound in balls. An element is accepted where its ball (plus |c| |q_t| |E_t|) decides its
  nearest float64, else the precision doubles: correct rounding, so that it agrees with
  mpmath's within one ulp. The "certified" engine is arb's: settled, with one ulp as its
  bound (no float64 engine with a rigorous bound yet).
"""

from __future__ import annotations

import mpmath
import numpy as np
from flint import arb, arb_mat

from ...inputs import AttentionInputs, as_float64
from ...reference.balls import balls, working_precision
from ...reference.certified import Certified
from ...reference.common import MAX_PREC, decided, resolve_recurrence
from ...reference.mp import DEFAULT_PREC as MP_PREC
from ...reference.mp import _settled, nearest
from ...specs import RSQRT_D, Spec, SpecError

ARB_PREC = 128
# Largest B*H*N*d*dv for which "auto" uses mpmath, the literal recurrence (as the delta
# rule's: arb is the faster one beyond a few hundred multiplications)
MP_MAX_STEPS = 2**6
SCALE_FLOOR = 2.0**-1000  # iplr_scale's least value: u s stays a nonzero float64


def checked(x: AttentionInputs, spec: Spec, initial_state) -> np.ndarray | None:
    """SpecError unless x carries a and b (inputs.validate_iplr); the initial state (B, H, d,
    dv) as an exact float64 array, or None."""
    want = (*x.q.shape[:3], 2 * x.q.shape[3])
    if spec.family != "iplr" or x.beta is None or x.beta.shape != want:
        raise SpecError(f"the IPLR engines take IPLR specs with a and b {want}, not {spec}")
    if initial_state is None:
        return None
    s0, _ = as_float64(initial_state, "initial_state")
    state = (*x.q.shape[:2], x.q.shape[3], x.v.shape[3])
    if s0.shape != state:
        raise SpecError(f"initial_state must have shape {state} (B, H, d, dv), got {s0.shape}")
    return s0


def split(x: AttentionInputs) -> tuple[np.ndarray, np.ndarray]:
    """(a, b), each (B, H, N, d), from the packed x.beta."""
    d = x.q.shape[3]
    return x.beta[..., :d], x.beta[..., d:]


def transition_norms(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """rho = ||I + b a^T||_2 (...) for a, b (..., d), in float64 (module docstring): 1 + the
    larger eigenvalue of C G, trace t = |a|^2 |b|^2 + 2 a.b, determinant -(|a|^2 |b|^2 -
    (a.b)^2) <= 0 (Cauchy-Schwarz), so lambda = t / 2 + sqrt(t^2 / 4 + |a|^2 |b|^2 - (a.b)^2)."""
    aa, bb, ab = (np.sum(s * t, -1) for s, t in ((a, a), (b, b), (a, b)))
    t = aa * bb + 2 * ab
    lam = t / 2 + np.sqrt(t * t / 4 + np.maximum(aa * bb - ab * ab, 0.0))
    return np.sqrt(1 + np.maximum(lam, 0.0))


def iplr_scale(q: np.ndarray, column_norms: np.ndarray, c: float) -> np.ndarray:
    """s_tc = |c| |q_t|_2 max_(j <= t) |S_j[:, c]|_2 (..., N, dv): the largest magnitude of
    state column c that row t's computation passed through, times the query's; at least
    SCALE_FLOOR. column_norms (..., N, dv) those of S_1 .. S_N."""
    largest = np.maximum.accumulate(column_norms, axis=-2)
    qn = np.sqrt(np.sum(q * q, axis=-1, keepdims=True))
    return np.fmax(abs(c) * qn * largest, SCALE_FLOOR)


def float64_states(x: AttentionInputs) -> tuple[np.ndarray, np.ndarray]:
    """(|S_t[:, c]|_2 (B, H, N, dv) for t = 1 .. N, S_N) by the recurrence in float64 from
    S_0 = 0: the magnitudes of the scale and of the bound (not a reference)."""
    a, b = split(x)
    b_, h_, n, d = x.q.shape
    state = np.zeros((b_, h_, d, x.v.shape[3]))
    norms = np.empty(x.v.shape)
    for t in range(n):
        w = np.einsum("bhm,bhmc->bhc", a[:, :, t], state)
        state = (
            state + b[:, :, t, :, None] * w[:, :, None] + x.k[:, :, t, :, None] * x.v[:, :, t, None]
        )
        norms[:, :, t] = np.sqrt(np.sum(state * state, -2))
    return norms, state


# ---------------------------------------------------------------------------- mpmath


def _mp_head(x: AttentionInputs, spec: Spec, bi: int, h: int, last: int, prec: int, s0):
    """Head (bi, h) through token `last` at `prec` bits: (outputs (last + 1, dv), their error
    estimates, S (d, dv), its estimates), rounded to float64 (module docstring). A step
    rounds d + 3 times on a column (the dot product a^T x, the product with b, k v, two
    sums), an output d + 2 (c q, the dot product)."""
    d, dv = x.q.shape[3], x.v.shape[3]
    a_, b_ = split(x)
    qs, ks, vs, as_, bs = (t[bi, h].tolist() for t in (x.q, x.k, x.v, a_, b_))
    n_step, n_out = d + 3, d + 2
    out, est = np.empty((last + 1, dv)), np.empty((last + 1, dv))
    with mpmath.workprec(prec):
        mp = mpmath.mp
        unit = mp.ldexp(1, -prec)
        c = 1 / mp.sqrt(d) if spec.scale == RSQRT_D else mp.mpf(spec.scale)
        rows = [[0.0] * dv] * d if s0 is None else s0[bi, h].tolist()
        state = [[mp.mpf(t) for t in row] for row in rows]
        err = [mp.zero] * dv
        for t in range(last + 1):
            q, k, v = ([mp.mpf(e) for e in r[t]] for r in (qs, ks, vs))
            a, b = [mp.mpf(e) for e in as_[t]], [mp.mpf(e) for e in bs[t]]
            before = list(zip(*state))
            w = [mp.fdot(a, before[col]) for col in range(dv)]
            state = [[s + bm * wc + km * vc for s, wc, vc in zip(r, w, v)]
                     for r, bm, km in zip(state, b, k)]  # fmt: skip
            aa, bb, ab = mp.fdot(a, a), mp.fdot(b, b), mp.fdot(a, b)
            tr = aa * bb + 2 * ab
            lam = tr / 2 + mp.sqrt(tr * tr / 4 + max(aa * bb - ab * ab, 0))
            grow = mp.sqrt(1 + max(lam, 0))
            after, qn, kn = list(zip(*state)), mp.sqrt(mp.fdot(q, q)), mp.sqrt(mp.fdot(k, k))
            for col in range(dv):
                xn = mp.sqrt(mp.fdot(before[col], before[col]))
                local = xn * (1 + mp.sqrt(aa * bb)) + kn * abs(v[col])
                err[col] = grow * err[col] + n_step * unit * local
                yn = mp.sqrt(mp.fdot(after[col], after[col]))
                out[t, col] = nearest(c * mp.fdot(q, after[col]))
                est[t, col] = nearest(abs(c) * qn * (err[col] + n_out * unit * yn))
        final = np.array([[nearest(e) for e in r] for r in state])
        final_est = np.array([[nearest(e) for e in err]] * d)
    return out, est, final, final_est


def mp_iplr(
    x: AttentionInputs,
    spec: Spec,
    initial_state: np.ndarray | None = None,
    state: bool = False,
    prec: int = MP_PREC,
    max_prec: int = MAX_PREC,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(o (B, H, N, dv), S_N (B, H, d, dv) if `state` else None), faithfully rounded to
    float64, by the literal recurrence in mpmath (module docstring)."""
    s0 = checked(x, spec, initial_state)
    runs: dict[tuple[int, int], tuple] = {}

    def solve(b: int, h: int, rows: list[int], p: int, need: bool):
        last = x.q.shape[2] - 1 if need else max(rows)
        low = _mp_head(x, spec, b, h, last, p, s0) if p == prec else runs[b, h]
        high = runs[b, h] = _mp_head(x, spec, b, h, last, 2 * p, s0)
        done = _settled(low[0][rows], high[0][rows], high[1][rows])
        final = high[2] if need and np.all(_settled(low[2], high[2], high[3])) else None
        return high[0][rows], done, final

    return resolve_recurrence(
        x.q.shape, x.v.shape, solve, prec, max_prec // 2, "mpmath engine (IPLR)", state
    )


# ---------------------------------------------------------------------------- arb


def _upper(ball: arb) -> arb:
    """max(ball's upper end, 0), an exact point."""
    top = ball.upper()
    return top if top > 0 else arb(0)


def _arb_norm(a: arb_mat, b: arb_mat) -> arb:
    """An upper bound on ||I + b a^T||_2 (transition_norms), a, b (d, 1) balls."""
    aa, bb, ab = ((s.transpose() * t)[0, 0] for s, t in ((a, a), (b, b), (a, b)))
    tr = aa * bb + 2 * ab
    lam = tr / 2 + _upper(tr * tr / 4 + (aa * bb - ab * ab)).sqrt()
    return (1 + _upper(lam)).sqrt().upper()


def _arb_head(x: AttentionInputs, spec: Spec, bi: int, h: int, last: int, prec: int, s0, need):
    """Head (bi, h) through token `last` at `prec` bits: (outputs (last + 1, dv), S (d, dv)
    or None unless `need`), NaN where a ball does not decide the float64."""
    d, dv = x.q.shape[3], x.v.shape[3]
    a_, b_ = split(x)
    out = np.empty((last + 1, dv))
    with working_precision(prec):
        c = arb(d).rsqrt() if spec.scale == RSQRT_D else arb(spec.scale)
        state = arb_mat(d, dv) if s0 is None else arb_mat(balls(s0[bi, h]))
        err = [arb(0)] * dv
        ones = arb_mat([[1] * d])
        for t in range(last + 1):
            a, b, k = (arb_mat(balls(m[bi, h, t][:, None])) for m in (a_, b_, x.k))
            q = arb_mat(balls(x.q[bi, h, t][None, :]))
            v = arb_mat(balls(x.v[bi, h, t][None, :]))
            ball = state + b * (a.transpose() * state) + k * v  # contains M_t S + k v^T
            state = ball.mid()
            radii = (ones * (ball - state)).tolist()[0]  # each >= the column's |r|_1
            grow = _arb_norm(a, b)
            err = [arb((grow * e + r.abs_upper()).upper()) for e, r in zip(err, radii)]
            qn = (q * q.transpose())[0, 0].sqrt()
            o = ((q * state) * c).tolist()[0]
            for col, (value, e) in enumerate(zip(o, err)):
                out[t, col] = decided(value + arb(0, (abs(c) * qn * e).upper()))
        if not need:
            return out, None
        final = [[decided(arb(s.mid(), e)) for s, e in zip(r, err)] for r in state.tolist()]
    return out, np.array(final)


def arb_iplr(
    x: AttentionInputs,
    spec: Spec,
    initial_state: np.ndarray | None = None,
    state: bool = False,
    prec: int = ARB_PREC,
    max_prec: int = MAX_PREC,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(o (B, H, N, dv), S_N (B, H, d, dv) if `state` else None), correctly rounded to
    float64, in ball arithmetic (module docstring)."""
    s0 = checked(x, spec, initial_state)

    def solve(b: int, h: int, rows: list[int], p: int, need: bool):
        last = x.q.shape[2] - 1 if need else max(rows)
        out, final = _arb_head(x, spec, b, h, last, p, s0, need)
        values = out[rows]
        final = None if final is None or np.isnan(final).any() else final
        return values, ~np.isnan(values).any(axis=1), final

    return resolve_recurrence(
        x.q.shape, x.v.shape, solve, prec, max_prec, "arb engine (IPLR)", state
    )


def exact_iplr_state(
    x: AttentionInputs, spec: Spec, initial_state: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(o, S_N) in float64: by mpmath for at most MP_MAX_STEPS multiplications, else arb."""
    b_, h_, n, d = x.q.shape
    engine = mp_iplr if b_ * h_ * n * d * x.v.shape[3] <= MP_MAX_STEPS else arb_iplr
    return engine(x, spec, initial_state, state=True)


def exact_iplr(x: AttentionInputs, spec: Spec, engine: str = "auto") -> np.ndarray:
    """The output by `engine`: "mp", "arb", "auto" (mp up to MP_MAX_STEPS, arb beyond) or
    "certified" (arb's: correctly rounded, module docstring)."""
    b, h, nq, _, d, dv = x.shape
    if engine == "auto":
        engine = "mp" if b * h * nq * d * dv <= MP_MAX_STEPS else "arb"
    return (mp_iplr if engine == "mp" else arb_iplr)(x, spec)[0]


def certified_iplr(x: AttentionInputs, spec: Spec, settle: np.ndarray | None = None) -> Certified:
    """arb's output, every row settled, each within one ulp (its bound), with the scale
    (iplr_scale) from float64 state magnitudes; `settle` asks nothing more."""
    values = arb_iplr(x, spec)[0]
    norms, _ = float64_states(x)
    scale = iplr_scale(x.q, norms, spec.scale_for(x.q.shape[3]))
    return Certified(values, np.spacing(np.abs(values)), scale, int(np.prod(x.q.shape[:3])))
