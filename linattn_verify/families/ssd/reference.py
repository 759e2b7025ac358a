"""The SSD layer's references: mpmath and arb (exact, agreeing), and the scale.

Definition (family.SSD_SOURCE: Dao & Gu 2024, "Transformers are SSMs", sec. 3-6, the SSD
layer of Mamba-2 as mamba_ssm's ssd_combined computes it), per batch b and head h, C_t and
B_t (d,), x_t and z_t (dv,), S_0 the initial state (d, dv) or 0:

    dt_t = min(max(f(dt'_t + dt_bias_h), dt_min), dt_max),   a_t = dt_t A_h,
    S_t = exp(a_t) S_(t-1) + dt_t B_t x_t^T,
    y_t = (S_t^T C_t + D_h x_t) [* silu(z_t)],   silu(z) = z / (1 + exp(-z)),

f softplus(s) = log(1 + exp(s)) exactly with Spec.dt_softplus (torch's and mamba_ssm's
return s itself above fields.SOFTPLUS_THRESHOLD; bound.py counts the difference), else the
identity; the gate with Spec.z_gate.

- mp (`mp_ssd`): the dual, quadratic form (the paper's sec. 3.2, y = M x with the
  semiseparable M_tj = C_t^T B_j exp(G_t - G_j) dt_j, G_t = a_1 + ... + a_t) in mpmath at p
  and 2p bits, with a first-order estimate of its error at 2p; rows accepted where the two
  agree within one ulp and the estimate is below 2^-64 of the value (reference.mp._settled:
  faithful rounding), else p doubles, up to MAX_PREC. Also the final state.
- arb (`arb_ssd`): the recurrence in balls (Johansson 2017, "Arb"): every element is
  accepted where its ball decides its nearest float64, else the precision doubles (correct
  rounding, agreeing with mpmath's within one ulp). The two engines share no formulation
  (dual form and recurrence), so that each checks the other (tests/test_ssd.py).
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
from ...specs import Spec, SpecError
from .inputs import SCALARS, width

ARB_PREC = 128
# Largest B*H*N*N*(d + dv) for which "auto" uses mpmath's quadratic form, arb beyond
MP_MAX_STEPS = 2**9
SCALE_FLOOR = 2.0**-1000  # ssd_scale's least value: u s stays a nonzero float64


def checked(x: AttentionInputs, spec: Spec, initial_state) -> np.ndarray | None:
    """SpecError unless x carries the SSD pack (inputs.validate_ssd); the initial state (B, H,
    d, dv) as an exact float64 array, or None."""
    want = (*x.q.shape[:3], width(spec, x.v.shape[3]))
    if spec.family != "ssd" or x.beta is None or x.beta.shape != want:
        raise SpecError(f"the SSD engines take SSD specs with the pack {want}, not {spec}")
    if initial_state is None:
        return None
    s0, _ = as_float64(initial_state, "initial_state")
    state = (*x.q.shape[:2], x.q.shape[3], x.v.shape[3])
    if s0.shape != state:
        raise SpecError(f"initial_state must have shape {state} (B, H, d, dv), got {s0.shape}")
    return s0


def softplus(s: np.ndarray) -> np.ndarray:
    """log(1 + exp(s)) in float64, without overflow."""
    return np.logaddexp(0.0, s)


def float64_steps(x: AttentionInputs, spec: Spec) -> tuple[np.ndarray, np.ndarray]:
    """(dt (B, H, N), a = dt A (B, H, N)) in float64: magnitudes for the scale and the bound."""
    s = x.beta[..., 0] + x.beta[..., 3]
    dt = np.clip(softplus(s) if spec.dt_softplus else s, spec.dt_min, spec.dt_max)
    return dt, dt * x.beta[..., 1]


def gates(x: AttentionInputs, spec: Spec) -> np.ndarray:
    """|silu(z)| (B, H, N, dv) with Spec.z_gate, else 1 (B, H, N, 1)."""
    if not spec.z_gate:
        return np.ones((*x.v.shape[:3], 1))
    return np.abs(silu(x.beta[..., SCALARS:]))


def silu(z: np.ndarray) -> np.ndarray:
    """z / (1 + exp(-z)) in float64."""
    with np.errstate(over="ignore"):
        return z / (1 + np.exp(-z))


def weights(x: AttentionInputs, spec: Spec) -> np.ndarray:
    """|M|_tj = (|C_t| . |B_j|) exp(G_t - G_j) dt_j for j <= t, else 0 (B, H, N, N), in
    float64: the dual form's weights by absolute values (module docstring)."""
    dt, a = float64_steps(x, spec)
    g = np.cumsum(a, -1)
    n = g.shape[-1]
    causal = np.tril(np.ones((n, n), dtype=bool))
    with np.errstate(over="ignore", invalid="ignore"):
        decay = np.where(causal, np.exp(np.where(causal, g[..., :, None] - g[..., None, :], 0)), 0)
    return (np.abs(x.q) @ np.swapaxes(np.abs(x.k), -1, -2)) * decay * dt[..., None, :]


def ssd_scale(x: AttentionInputs, spec: Spec, w: np.ndarray) -> np.ndarray:
    """s_tc = |silu(z_tc)| (sum_j |M|_tj |x_jc| + |D_h x_tc|) (B, H, N, dv), w = weights(x,
    spec), without the gate's factor unless Spec.z_gate: the magnitude the computation
    works at, at least SCALE_FLOOR."""
    skip = np.abs(x.beta[..., 2:3] * x.v)
    return np.fmax(gates(x, spec) * (w @ np.abs(x.v) + skip), SCALE_FLOOR)


def _mp_dt(s: mpmath.mpf, spec: Spec) -> mpmath.mpf:
    """dt from s = dt' + dt_bias in mpmath (module docstring)."""
    dt = mpmath.log1p(mpmath.exp(s)) if spec.dt_softplus else s
    return min(max(dt, mpmath.mpf(spec.dt_min)), mpmath.mpf(spec.dt_max))


def _arb_dt(s: arb, spec: Spec) -> arb:
    """dt from s = dt' + dt_bias in balls (module docstring)."""
    dt = s.exp().log1p() if spec.dt_softplus else s
    dt = dt.max(arb(spec.dt_min))
    return dt if spec.dt_max == float("inf") else dt.min(arb(spec.dt_max))


# ---------------------------------------------------------------------------- mpmath


def _mp_head(x: AttentionInputs, spec: Spec, bi: int, h: int, last: int, prec: int, s0):
    """Head (bi, h) through token `last` at `prec` bits by the dual form: (outputs (last + 1,
    dv), their error estimates, S (d, dv), its estimates), rounded to float64."""
    d, dv = x.q.shape[3], x.v.shape[3]
    cs, bs, xs, pack = (t[bi, h, : last + 1].tolist() for t in (x.q, x.k, x.v, x.beta))
    out, est = np.empty((last + 1, dv)), np.empty((last + 1, dv))
    with mpmath.workprec(prec):
        mp = mpmath.mpf
        a_h, d_h, bias = (mp(pack[0][i]) if pack else mp(0) for i in (1, 2, 3))
        dt = [_mp_dt(mp(row[0]) + bias, spec) for row in pack]
        g = [mp(0)]
        for step in dt:
            g.append(g[-1] + step * a_h)
        start = None if s0 is None else [[mp(e) for e in r] for r in s0[bi, h].tolist()]
        unit = mpmath.ldexp(1, -prec)
        for t in range(last + 1):
            c = [mp(e) for e in cs[t]]
            weights = [mpmath.fdot(c, bs[j]) * mpmath.exp(g[t + 1] - g[j + 1]) * dt[j]
                       for j in range(t + 1)]  # fmt: skip
            sizes = [mpmath.fdot([abs(e) for e in c], [abs(e) for e in bs[j]])
                     * mpmath.exp(g[t + 1] - g[j + 1]) * dt[j] for j in range(t + 1)]  # fmt: skip
            n = d + 3 * (t + 1) + 20
            for col in range(dv):
                y = mpmath.fdot(weights, [xs[j][col] for j in range(t + 1)]) + d_h * xs[t][col]
                size = mpmath.fdot(sizes, [abs(xs[j][col]) for j in range(t + 1)])
                size += abs(d_h * xs[t][col])
                if start is not None:
                    carried = mpmath.exp(g[t + 1]) * mpmath.fdot(c, [r[col] for r in start])
                    y += carried
                    size += abs(carried)
                z = mp(pack[t][SCALARS + col]) if spec.z_gate else None
                gate = 1 if z is None else z / (1 + mpmath.exp(-z))
                out[t, col] = nearest(y * gate)
                est[t, col] = nearest(n * (1 + abs(g[t + 1])) * unit * size * abs(gate))
        state, state_est = np.empty((d, dv)), np.empty((d, dv))
        for m in range(d):
            for col in range(dv):
                terms = [mpmath.exp(g[-1] - g[j + 1]) * dt[j] * bs[j][m] * xs[j][col]
                         for j in range(last + 1)]  # fmt: skip
                value = mpmath.fsum(terms)
                size = mpmath.fsum(abs(e) for e in terms)
                if start is not None:
                    value += mpmath.exp(g[-1]) * start[m][col]
                    size += abs(mpmath.exp(g[-1]) * start[m][col])
                state[m, col] = nearest(value)
                n = 3 * (last + 1) + 20
                state_est[m, col] = nearest(n * (1 + abs(g[-1])) * unit * size)
    return out, est, state, state_est


def mp_ssd(
    x: AttentionInputs,
    spec: Spec,
    initial_state: np.ndarray | None = None,
    state: bool = False,
    prec: int = MP_PREC,
    max_prec: int = MAX_PREC,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(y (B, H, N, dv), S_N (B, H, d, dv) if `state` else None), faithfully rounded to
    float64, by the dual form in mpmath (module docstring)."""
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
        x.q.shape, x.v.shape, solve, prec, max_prec // 2, "mpmath engine (SSD)", state
    )


# ---------------------------------------------------------------------------- arb


def _arb_head(x: AttentionInputs, spec: Spec, bi: int, h: int, last: int, prec: int, s0, need):
    """Head (bi, h) through token `last` at `prec` bits by the recurrence: (outputs (last +
    1, dv), S (d, dv) or None unless `need`), NaN where a ball does not decide the float64."""
    d, dv = x.q.shape[3], x.v.shape[3]
    pack = x.beta[bi, h]
    out = np.empty((last + 1, dv))
    with working_precision(prec):
        a_h, d_h, bias = (arb(pack[0, i]) if len(pack) else arb(0) for i in (1, 2, 3))
        state = arb_mat(d, dv) if s0 is None else arb_mat(balls(s0[bi, h]))
        for t in range(last + 1):
            dt = _arb_dt(arb(pack[t, 0]) + bias, spec)
            b = arb_mat(balls(x.k[bi, h, t][:, None]))
            c = arb_mat(balls(x.q[bi, h, t][None, :]))
            v = arb_mat(balls(x.v[bi, h, t][None, :]))
            state = state * (dt * a_h).exp() + b * (v * dt)
            y = (c * state + v * d_h).tolist()[0]
            for col, value in enumerate(y):
                z = arb(pack[t, SCALARS + col]) if spec.z_gate else None
                out[t, col] = decided(value if z is None else value * z / (1 + (-z).exp()))
        if not need:
            return out, None
        final = [[decided(e) for e in row] for row in state.tolist()]
    return out, np.array(final)


def arb_ssd(
    x: AttentionInputs,
    spec: Spec,
    initial_state: np.ndarray | None = None,
    state: bool = False,
    prec: int = ARB_PREC,
    max_prec: int = MAX_PREC,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(y (B, H, N, dv), S_N (B, H, d, dv) if `state` else None), correctly rounded to
    float64, in ball arithmetic (module docstring)."""
    s0 = checked(x, spec, initial_state)

    def solve(b: int, h: int, rows: list[int], p: int, need: bool):
        last = x.q.shape[2] - 1 if need else max(rows)
        out, final = _arb_head(x, spec, b, h, last, p, s0, need)
        values = out[rows]
        final = None if final is None or np.isnan(final).any() else final
        return values, ~np.isnan(values).any(axis=1), final

    return resolve_recurrence(
        x.q.shape, x.v.shape, solve, prec, max_prec, "arb engine (SSD)", state
    )


def _mp_cost(x: AttentionInputs) -> int:
    """B H N^2 (d + dv): the dual form's multiplications."""
    b, h, n, d = x.q.shape
    return b * h * n * n * (d + x.v.shape[3])


def exact_ssd_state(
    x: AttentionInputs, spec: Spec, initial_state: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(y, S_N) in float64: by mpmath up to MP_MAX_STEPS multiplications, else arb."""
    engine = mp_ssd if _mp_cost(x) <= MP_MAX_STEPS else arb_ssd
    return engine(x, spec, initial_state, state=True)


def exact_ssd(x: AttentionInputs, spec: Spec, engine: str = "auto") -> np.ndarray:
    """The output by `engine`: "mp", "arb", "auto" (mp up to MP_MAX_STEPS, arb beyond) or
    "certified" (arb's: correctly rounded)."""
    if engine == "auto":
        engine = "mp" if _mp_cost(x) <= MP_MAX_STEPS else "arb"
    return (mp_ssd if engine == "mp" else arb_ssd)(x, spec)[0]


def certified_ssd(x: AttentionInputs, spec: Spec, settle: np.ndarray | None = None) -> Certified:
    """arb's output, every row settled, each within one ulp (its bound), with the scale
    (ssd_scale); `settle` asks nothing more."""
    values = arb_ssd(x, spec)[0]
    rows = int(np.prod(x.q.shape[:3]))
    scale = ssd_scale(x, spec, weights(x, spec))
    return Certified(values, np.spacing(np.abs(values)), scale, rows)
