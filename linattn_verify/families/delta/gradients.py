"""Exact reference gradients of the delta rule: mpmath (faithful) and arb (correctly rounded).

Forward (families/delta/reference.py and fields.py: DeltaNet, Yang et al. 2024, "Parallelizing
Linear Transformers with the Delta Rule over Sequence Length", eq. 1-2; Gated DeltaNet,
Yang, Kautz, Hatamizadeh, ICLR 2025; KDA, fla's `kda`), per batch b and head h, c the
spec's scale (1/sqrt(d) exactly for RSQRT_D), S_0 the initial state (d, dv) or 0, and with
qk_l2norm q_t, k_t first x / r, r = sqrt(|x|^2 + QK_L2NORM_EPS):

    y_t = D_t S_(t-1)   (D_t = exp(g_t) I, diag(exp(g_t)) for channel gates, or I)
    u_t = v_t - y_t^T k_t,   S_t = y_t + beta_t k_t u_t^T,   o_t = c S_t^T q_t

Loss L = sum_(t,c) o_tc G_tc + sum_(m,c) S_N[m,c] G_S[m,c], G the output cotangent
(B, H, N, dv), G_S the final state's (B, H, d, dv; 0 if not given). Reverse mode (the
chain rule backwards through the recurrence: Baydin et al. 2018, "Automatic differentiation
in machine learning: a survey", sec. 3.1). With Lam_t = dL/dS_t, the total adjoint of S_t
(its use in o_t and in S_(t+1)):

    Lam_N = G_S + c q_N G_N^T
    dq_t = c S_t G_t                                    (o_t = c S_t^T q_t)
    dv_t = beta_t Lam_t^T k_t                           (S_t holds beta_t k_t v_t^T)
    dbeta_t = k_t^T Lam_t u_t                           (dS_t/dbeta_t = k_t u_t^T)
    dk_t = beta_t Lam_t u_t - beta_t y_t (Lam_t^T k_t)  (d<Lam, -beta k k^T y>/dk =
                                                         -beta (y Lam^T + Lam y^T) k)
    Lam'_t = dL/dy_t = (I - beta_t k_t k_t^T) Lam_t
    dg_t = sum_(m,c) y_t[m,c] Lam'_t[m,c]   (gates: dy_t/dg_t = y_t)
    dg_tm = sum_c y_t[m,c] Lam'_t[m,c]      (channel gates: row m of y_t is exp(g_tm) S)
    Lam_(t-1) = D_t Lam'_t + c q_(t-1) G_(t-1)^T,   dS_0 = D_1 Lam'_1
    qk_l2norm: dx = (dxhat - xhat (xhat . dxhat)) / r, the Jacobian of x / r being
               (I - xhat xhat^T) / r (symmetric) for x = q_t, k_t

(t counted from 1 here, from 0 in the code). Each value column of Lam evolves on its own,
lam_(t-1) = A_t^T lam_t + c q_(t-1) G_(t-1),c with A_t^T = D_t (I - beta_t k_t k_t^T): the
transposed forward transition, whose 2-norm has the forward's bound G_t = max_m D_tm
max(1, |1 - beta_t |k_t|^2|) (delta.py's module docstring). Errors are carried normwise per
column for both recurrences, E_t forward and F_t backward (|F_(t-1)| <= G_t |F_t| + local):
componentwise radii would grow like (1 + |beta| |k|^2)^N and never settle.

- mp (`mp_delta_gradients`): the recurrences in mpmath at p and 2p bits (p = 113 first),
  with a first-order estimate at 2p: E_t, F_t as above with local errors n 2^-2p times the
  magnitudes of each step (gamma_n to first order, n from `_roundings`), then per element
  the propagated errors of its factors (|S_t - S^_t|_2 <= E_t, |y_t - y^_t|_2 <= max_m D_tm
  E_(t-1), and so on, each bounding every component) plus its own roundings. An element is
  accepted where the two roundings are within one ulp and the estimate is below 2^-64 of
  the value (or half the smallest subnormal), as in mp.py; else the head is recomputed at
  4p, 8p, ... up to max_prec (ReferenceAccuracyError). Faithful rounding.
- arb (`arb_delta_gradients`): both recurrences in balls recentred at every token (as
  arb_delta: a step is evaluated in balls from the exact midpoint, its radii bound the local
  error rigorously, the midpoint goes on and |E_t|, |F_t| are carried as above), so that
  S_t, y_t, u_t, Lam_t and Lam'_t are each held as a ball containing the exact value (the
  midpoints widened by the carried bound, per component); each gradient element is then
  evaluated from those in ball arithmetic and accepted where its ball decides its nearest
  float64, else the head is recomputed at twice the bits: correct rounding, bit for bit
  with mpmath wherever mpmath's faithful value is the nearest.

Exact zeros stay exact in both (no precision runs away on them): with S_0 = 0, y_1 = 0 and
so dg_1 = 0; where G_t = 0, dq_t = 0; where beta_t = 0, dv_t = dk_t = 0; with G = 0 and
G_S = 0, every gradient is 0. Their values and estimates (radii) are products with an
exact 0. A gradient that is 0 by cancellation settles only near 1100 bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mpmath
import numpy as np
from flint import arb, arb_mat

from ...inputs import AttentionInputs, as_float64
from ...reference.balls import balls, working_precision
from ...reference.common import MAX_PREC, ReferenceAccuracyError, decided
from ...reference.grad import agree
from ...reference.mp import DEFAULT_PREC as MP_PREC
from ...reference.mp import nearest
from ...specs import RSQRT_D, Spec, SpecError
from .fields import QK_L2NORM_EPS
from .reference import ARB_PREC, checked_initial_state, log_gate_rows

FAITHFUL = 2.0**-64  # the relative error estimate under which an mp element is accepted
TINY = 2.0**-1076  # half the smallest subnormal: an estimate below it decides 0 or the subnormal


def _inputs(x: AttentionInputs, spec: Spec, g_out: Any, g_state: Any, initial_state: Any):
    """(G, G_S or None, S_0 or None) as exact float64 arrays; SpecError for a non-delta spec,
    missing beta, or a misshapen cotangent, gate array or initial state."""
    s0 = checked_initial_state(x, spec, initial_state)
    b_, h_, n, d = x.q.shape
    dv = x.v.shape[3]
    if x.beta.shape != (b_, h_, n):
        raise SpecError(f"beta must have shape {(b_, h_, n)} (B, H, N), got {x.beta.shape}")
    if spec.decay is not None:
        want = (b_, h_, n) if spec.decay == "gates" else (b_, h_, n, d)
        if x.decay is None or x.decay.shape != want:
            got = None if x.decay is None else x.decay.shape
            raise SpecError(f"{spec} needs log-gates g of shape {want}, got {got}")
    go, _ = as_float64(g_out, "g_out")
    if go.shape != (b_, h_, n, dv):
        raise SpecError(f"g_out must have shape {(b_, h_, n, dv)} (B, H, N, dv), got {go.shape}")
    gs = None
    if g_state is not None:
        gs, _ = as_float64(g_state, "g_state")
        if gs.shape != (b_, h_, d, dv):
            raise SpecError(
                f"g_state must have shape {(b_, h_, d, dv)} (B, H, d, dv), got {gs.shape}"
            )
    return go, gs, s0


def _shapes(x: AttentionInputs, spec: Spec, with_s0: bool) -> dict[str, tuple[int, ...]]:
    """Per head, the shape of each gradient."""
    n, d = x.q.shape[2:]
    dv = x.v.shape[3]
    shapes = {"q": (n, d), "k": (n, d), "v": (n, dv), "beta": (n,)}
    if spec.decay is not None:
        shapes["g"] = (n,) if spec.decay == "gates" else (n, d)
    if with_s0:
        shapes["S0"] = (d, dv)
    return shapes


def _roundings(spec: Spec, d: int, dv: int) -> int:
    """A generous n for the local errors n 2^-p M of mp's estimate: a dot product over d or
    dv and the few scalar operations around it (the gate's exp, beta, c), and with
    qk_l2norm a normalised q or k (d + 3, entering twice)."""
    return 2 * (d + dv) + 16 + 2 * (d + 3) * spec.qk_l2norm


# ---------------------------------------------------------------------------- mpmath


def _mp_unit(a: list) -> tuple[list, Any]:
    """(a / r, 1 / r), r = sqrt(|a|^2 + QK_L2NORM_EPS)."""
    mp = mpmath.mp
    inv = 1 / mp.sqrt(mp.fdot(a, a) + mp.mpf(QK_L2NORM_EPS))
    return [t * inv for t in a], inv


def _mp_project(xhat: list, inv, dhat: list, err) -> tuple[list, Any]:
    """(dx, its error estimate) from dxhat and its: (dxhat - xhat (xhat . dxhat)) / r, a map
    of 2-norm at most 1 / r."""
    mp = mpmath.mp
    along = mp.fdot(xhat, dhat)
    dx = [(a - m * along) * inv for a, m in zip(dhat, xhat, strict=True)]
    return dx, (err + 3 * _mp_roundoff() * mp.sqrt(mp.fdot(dhat, dhat))) * inv


def _mp_roundoff():
    """2^-p at the working precision."""
    return mpmath.mp.ldexp(1, -mpmath.mp.prec)


def _scaled(factors: list | None, cols: list) -> list:
    """D_t applied to a matrix held as columns: row m times factors[m] (None: D_t = I)."""
    if factors is None:
        return cols
    return [[f * a for f, a in zip(factors, col, strict=True)] for col in cols]


@dataclass
class _MpHead:
    """One head's inputs at the working precision, and what the passes share."""

    spec: Spec
    c: Any  # the scale and its absolute value
    ac: Any
    nu: Any  # n 2^-p, the local errors' rate (_roundings)
    qs: list  # q_t, k_t (normalised with qk_l2norm), 1 / r of each, |q_t|, |k_t|^2, |k_t|
    ks: list
    invq: list
    invk: list
    qns: list
    k2s: list
    kns: list
    vs: list
    gcot: list  # G_t
    betas: list
    facs: list | None  # exp(g_t) per row, or None
    tops: list  # max_m exp(g_tm)
    spreads: list  # max(1, |1 - beta_t |k_t|^2|)
    grows: list  # tops * spreads: G_t, the transitions' bound

    @classmethod
    def of(cls, x: AttentionInputs, spec: Spec, b: int, h: int, go) -> _MpHead:
        """Head (b, h) of x, the cotangent go, at the working precision."""
        mp, mpf = mpmath.mp, mpmath.mp.mpf
        n, d = x.q.shape[2:]
        qs, ks, invq, invk = [], [], [], []
        for t in range(n):
            q, k = ([mpf(a) for a in z[b, h, t].tolist()] for z in (x.q, x.k))
            if spec.qk_l2norm:
                (q, iq), (k, ik) = _mp_unit(q), _mp_unit(k)
                invq.append(iq)
                invk.append(ik)
            qs.append(q)
            ks.append(k)
        gates = log_gate_rows(x, spec, b, h)
        betas = [mpf(a) for a in x.beta[b, h].tolist()]
        facs = None if gates is None else [[mp.exp(mpf(g)) for g in row] for row in gates]
        tops = [mpf(1)] * n if facs is None else [max(f) for f in facs]
        k2s = [mp.fdot(k, k) for k in ks]
        spreads = [max(1, abs(1 - bt * k2)) for bt, k2 in zip(betas, k2s, strict=True)]
        c = 1 / mp.sqrt(d) if spec.scale == RSQRT_D else mpf(spec.scale)
        return cls(
            spec, c, abs(c), _roundings(spec, d, x.v.shape[3]) * _mp_roundoff(),
            qs, ks, invq, invk, [_mp_norm(q) for q in qs], k2s, [mp.sqrt(t) for t in k2s],
            [[mpf(a) for a in row] for row in x.v[b, h].tolist()],
            [[mpf(a) for a in row] for row in go[b, h].tolist()],
            betas, facs, tops, spreads,
            [top * s for top, s in zip(tops, spreads, strict=True)],
        )  # fmt: skip


def _mp_norm(a: list):
    return mpmath.mp.sqrt(mpmath.mp.fdot(a, a))


def _mp_forward(hd: _MpHead, s0) -> list[tuple]:
    """Per token, (y, |y_c|, dy_c, u, du_c, S, |S_c|, E_c): y_t, u_t, S_t by columns (lists
    of d), the 2-norms of the columns and the error estimates (module docstring)."""
    mp, nu, fdot = mpmath.mp, hd.nu, mpmath.mp.fdot
    d, dv = len(hd.ks[0]), len(hd.vs[0])
    cols = [[mp.zero] * d for _ in range(dv)] if s0 is None else s0
    err = [mp.zero] * dv
    fw = []
    for t, (k, beta, v, top) in enumerate(zip(hd.ks, hd.betas, hd.vs, hd.tops, strict=True)):
        y = _scaled(None if hd.facs is None else hd.facs[t], cols)
        yn = [_mp_norm(col) for col in y]
        dy = [top * e + nu * m for e, m in zip(err, yn, strict=True)]
        u = [vc - fdot(k, col) for vc, col in zip(v, y, strict=True)]
        kn, ab = hd.kns[t], abs(beta)
        du = [kn * dyc + nu * (abs(vc) + kn * m) for dyc, vc, m in zip(dy, v, yn, strict=True)]
        bk = [beta * a for a in k]
        cols = [[a + bm * uc for a, bm in zip(col, bk)] for col, uc in zip(y, u, strict=True)]
        err = [
            hd.grows[t] * e + nu * (m * (1 + ab * hd.k2s[t]) + ab * kn * abs(vc))
            for e, m, vc in zip(err, yn, v, strict=True)
        ]
        fw.append((y, yn, dy, u, du, cols, [_mp_norm(col) for col in cols], err))
    return fw


def _mp_grad_head(x, spec, b, h, prec, go, gs, s0, shapes) -> dict[str, tuple]:
    """Head (b, h) at `prec` bits: {name: (values, error estimates)}, float64 arrays of the
    shapes `shapes` (module docstring)."""
    n, d = x.q.shape[2:]
    dv = x.v.shape[3]
    vals = {name: np.empty(shape) for name, shape in shapes.items()}
    ests = {name: np.empty(shape) for name, shape in shapes.items()}
    with mpmath.workprec(prec):
        mp = mpmath.mp
        mpf, fdot, fsum = mp.mpf, mp.fdot, mp.fsum
        hd = _MpHead.of(x, spec, b, h, go)
        nu, c, ac, gcot = hd.nu, hd.c, hd.ac, hd.gcot
        state = None if s0 is None else [[mpf(a) for a in col] for col in s0[b, h].T.tolist()]
        fw = _mp_forward(hd, state)
        # backward, by columns: Lam_t and its error estimate F_t
        lam = [[mp.zero] * d for _ in range(dv)]
        if gs is not None:
            lam = [[mpf(a) for a in col] for col in gs[b, h].T.tolist()]
        qn, gn = hd.qs[n - 1], gcot[n - 1]
        lam = [[a + c * qm * gc for a, qm in zip(col, qn)] for col, gc in zip(lam, gn, strict=True)]
        fe = [nu * (_mp_norm(col) + ac * hd.qns[n - 1] * abs(gc)) for col, gc in zip(lam, gn)]
        for t in reversed(range(n)):
            y, yn, dy, u, du, st, sn, et = fw[t]
            k, beta, kn = hd.ks[t], hd.betas[t], hd.kns[t]
            ab = abs(beta)
            ln = [_mp_norm(col) for col in lam]
            kl = [fdot(k, col) for col in lam]
            # dv_t = beta Lam^T k
            vals["v"][t] = [nearest(beta * a) for a in kl]
            ests["v"][t] = [nearest(ab * kn * (f + 2 * nu * m)) for f, m in zip(fe, ln)]
            # dbeta_t = k^T Lam u
            vals["beta"][t] = nearest(fdot(kl, u))
            ests["beta"][t] = nearest(
                kn * fsum(f * abs(uc) + m * duc + nu * m * abs(uc)
                          for f, m, uc, duc in zip(fe, ln, u, du, strict=True))
            )  # fmt: skip
            # dk_t = beta (Lam u - y (Lam^T k)), by rows m
            dk = [
                beta * (fdot((col[m] for col in lam), u) - fdot((col[m] for col in y), kl))
                for m in range(d)
            ]
            ek = ab * fsum(
                f * abs(uc) + m * duc + dyc * kn * m + yc * (kn * f + nu * kn * m)
                + nu * (m * abs(uc) + yc * kn * m)
                for f, m, uc, duc, dyc, yc in zip(fe, ln, u, du, dy, yn, strict=True)
            )  # fmt: skip
            # dq_t = c S_t G_t, by rows m
            gt = gcot[t]
            dq = [c * fdot((col[m] for col in st), gt) for m in range(d)]
            eq = ac * fsum(abs(gc) * (e + nu * m) for gc, e, m in zip(gt, et, sn, strict=True))
            if spec.qk_l2norm:
                dk, ek = _mp_project(k, hd.invk[t], dk, ek)
                dq, eq = _mp_project(hd.qs[t], hd.invq[t], dq, eq)
            vals["k"][t], ests["k"][t] = [nearest(a) for a in dk], nearest(ek)
            vals["q"][t], ests["q"][t] = [nearest(a) for a in dq], nearest(eq)
            # Lam' = (I - beta k k^T) Lam
            bk = [beta * a for a in k]
            lp = [[a - bm * b_ for a, bm in zip(col, bk)] for col, b_ in zip(lam, kl, strict=True)]
            lpn = [_mp_norm(col) for col in lp]
            dlp = [hd.spreads[t] * f + nu * m * (1 + ab * hd.k2s[t]) for f, m in zip(fe, ln)]
            if spec.decay == "gates":
                vals["g"][t] = nearest(fsum(fdot(a, p) for a, p in zip(y, lp, strict=True)))
                ests["g"][t] = nearest(
                    fsum(dyc * pn + m * dp + nu * m * pn
                         for dyc, pn, m, dp in zip(dy, lpn, yn, dlp, strict=True))
                )  # fmt: skip
            elif spec.decay == "channel-gates":
                for m in range(d):
                    ym, pm = [col[m] for col in y], [col[m] for col in lp]
                    vals["g"][t, m] = nearest(fdot(ym, pm))
                    ests["g"][t, m] = nearest(
                        fsum(dyc * abs(p) + abs(a) * dp + nu * abs(a) * abs(p)
                             for a, p, dyc, dp in zip(ym, pm, dy, dlp, strict=True))
                    )  # fmt: skip
            top, scaled = hd.tops[t], _scaled(None if hd.facs is None else hd.facs[t], lp)
            if t == 0:
                if "S0" in shapes:  # dS_0 = D_1 Lam'_1
                    vals["S0"][:] = [[nearest(a) for a in row] for row in zip(*scaled)]
                    ests["S0"][:] = [
                        [nearest(top * dp + nu * abs(a)) for a, dp in zip(row, dlp)]
                        for row in zip(*scaled)
                    ]
                break
            # Lam_(t-1) = D_t Lam'_t + c q_(t-1) G_(t-1)^T
            qp, gp = hd.qs[t - 1], gcot[t - 1]
            lam = [
                [a + c * qm * gc for a, qm in zip(col, qp)]
                for col, gc in zip(scaled, gp, strict=True)
            ]
            fe = [
                top * dp + nu * (top * pn + ac * hd.qns[t - 1] * abs(gc))
                for dp, pn, gc in zip(dlp, lpn, gp, strict=True)
            ]
    return {name: (vals[name], ests[name]) for name in shapes}


def _mp_refine_head(x, spec, b, h, go, gs, s0, shapes, prec, max_prec) -> dict[str, np.ndarray]:
    """Head (b, h), each element accepted at the first p where p and 2p agree within one
    ulp and 2p's estimate is below FAITHFUL of the value (module docstring)."""
    out = {name: np.empty(shape) for name, shape in shapes.items()}
    done = {name: np.zeros(shape, dtype=bool) for name, shape in shapes.items()}
    low = _mp_grad_head(x, spec, b, h, prec, go, gs, s0, shapes)
    p = prec
    while True:
        if 2 * p > max_prec:
            left = {name: int((~done[name]).sum()) for name in shapes}
            raise ReferenceAccuracyError(
                f"mpmath engine (delta-rule gradients): elements of head ({b}, {h}) not "
                f"resolved to float64 at {max_prec} bits (unresolved per gradient: {left})"
            )
        high = _mp_grad_head(x, spec, b, h, 2 * p, go, gs, s0, shapes)
        for name in shapes:
            (lv, _), (hv, he) = low[name], high[name]
            with np.errstate(invalid="ignore"):
                small = he <= np.fmax(np.abs(hv) * FAITHFUL, TINY)
            new = ~done[name] & agree(lv, hv) & small
            out[name][new] = hv[new]
            done[name] |= new
        if all(done[name].all() for name in shapes):
            return out
        low, p = high, 2 * p


def _gradients(x, spec, g_out, g_state, initial_state, head) -> dict[str, np.ndarray]:
    """{name: (B, H, ...)} from head(b, h, go, gs, s0, shapes) -> {name: per-head array}."""
    go, gs, s0 = _inputs(x, spec, g_out, g_state, initial_state)
    shapes = _shapes(x, spec, initial_state is not None or g_state is not None)
    b_, h_ = x.q.shape[:2]
    out = {name: np.empty((b_, h_, *shape)) for name, shape in shapes.items()}
    for b in range(b_):
        for h in range(h_):
            for name, values in head(b, h, go, gs, s0, shapes).items():
                out[name][b, h] = values
    return out


def mp_delta_gradients(
    x: AttentionInputs,
    spec: Spec,
    g_out: Any,
    g_state: Any = None,
    initial_state: Any = None,
    prec: int = MP_PREC,
    max_prec: int = MAX_PREC,
) -> dict[str, np.ndarray]:
    """dL/dq, dL/dk, dL/dv, dL/dbeta (and dL/dg; dL/dS_0 as "S0" when initial_state or
    g_state is given) for L = sum(o * g_out) + sum(S_N * g_state), each faithfully rounded
    to float64 by the recurrences in mpmath (module docstring)."""

    def head(b, h, go, gs, s0, shapes):
        return _mp_refine_head(x, spec, b, h, go, gs, s0, shapes, prec, max_prec)

    return _gradients(x, spec, g_out, g_state, initial_state, head)


# ---------------------------------------------------------------------------- arb


def _spread(row: arb_mat) -> arb_mat:
    """Every row of a 1 x dv matrix of non-negative bounds e_c as balls [0 +/- e_c]."""
    return arb_mat([[arb(0, e) for e in row]])


def _radii(ball: arb_mat, mid: arb_mat, ones_row: arb_mat) -> list:
    """Upper bounds on the 1-norms (so the 2-norms) of ball - mid's columns."""
    return [r.abs_upper() for r in (ones_row * (ball - mid)).tolist()[0]]


def _arb_grad_head(x, spec, b, h, prec, go, gs, s0, shapes) -> dict[str, np.ndarray]:
    """Head (b, h) at `prec` bits: {name: float64 values}, NaN where an element's ball does
    not decide its nearest float64 (module docstring)."""
    n, d = x.q.shape[2:]
    dv = x.v.shape[3]
    gates = log_gate_rows(x, spec, b, h)
    out = {name: np.full(shape, np.nan) for name, shape in shapes.items()}
    with working_precision(prec):
        one = arb(1)
        c = arb(d).rsqrt() if spec.scale == RSQRT_D else arb(spec.scale)
        ones_col, ones_row = arb_mat([[1]] * d), arb_mat([[1] * d])

        def widened(mid: arb_mat, bounds: list) -> arb_mat:
            """mid with every component of column c widened by bounds[c]."""
            return mid + ones_col * _spread(bounds)

        def decide(name: str, index, balls_: list) -> None:
            out[name][index] = [decided(a) for a in balls_]

        qs, ks, invq, invk = [], [], [], []
        for t in range(n):
            q, k = arb_mat(balls(x.q[b, h, t][:, None])), arb_mat(balls(x.k[b, h, t][:, None]))
            if spec.qk_l2norm:
                iq = ((q.transpose() * q)[0, 0] + arb(QK_L2NORM_EPS)).rsqrt()
                ik = ((k.transpose() * k)[0, 0] + arb(QK_L2NORM_EPS)).rsqrt()
                q, k = q * iq, k * ik
                invq.append(iq)
                invk.append(ik)
            qs.append(q)
            ks.append(k)
        vs = [arb_mat(balls(row[None, :])) for row in x.v[b, h]]
        gcot = [arb_mat(balls(row[None, :])) for row in go[b, h]]
        betas = [arb(a) for a in x.beta[b, h].tolist()]
        if gates is None:
            decays = [None] * n
            tops = [one] * n
        else:
            # the gate as a scalar, or diag(exp(g_t)) for channel gates
            decays = [
                arb(row[0]).exp() if spec.decay == "gates"
                else arb_mat([[arb(g).exp() if i == j else 0 for j, _ in enumerate(row)]
                              for i, g in enumerate(row)])
                for row in gates
            ]  # fmt: skip
            tops = [arb(max(row)).exp() for row in gates]

        def scale_rows(t: int, a: arb_mat) -> arb_mat:
            """D_t a."""
            f = decays[t]
            if f is None:
                return a
            return a * f if spec.decay == "gates" else f * a

        spreads, grows = [], []
        for k, beta, top in zip(ks, betas, tops, strict=True):
            s = (one - beta * (k.transpose() * k)[0, 0]).abs_upper()
            s = arb(s if s > one else one)
            spreads.append(s)
            grows.append(arb((top * s).upper()))

        # forward, recentred: S^_t exact midpoints, E_t (per column) bounds on |S^_t - S_t|
        state = arb_mat(d, dv) if s0 is None else arb_mat(balls(s0[b, h]))
        err = [arb(0)] * dv
        fw = []  # per token: balls containing the exact y_t, u_t, S_t
        for t in range(n):
            k, beta = ks[t], betas[t]
            y_mid = scale_rows(t, state)
            y = widened(y_mid, [(tops[t] * e).upper() for e in err])
            u = vs[t] - k.transpose() * y
            ball = y_mid + k * ((vs[t] - k.transpose() * y_mid) * beta)
            state = ball.mid()
            err = [
                arb((grows[t] * e + r).upper())
                for e, r in zip(err, _radii(ball, state, ones_row), strict=True)
            ]
            fw.append((y, u, widened(state, err)))

        # backward, recentred: Lam^_t midpoints, F_t bounds on |Lam^_t - Lam_t|
        ball = c * qs[n - 1] * gcot[n - 1]
        if gs is not None:
            ball += arb_mat(balls(gs[b, h]))
        lam = ball.mid()
        fe = _radii(ball, lam, ones_row)
        for t in reversed(range(n)):
            y, u, st = fw[t]
            k, beta = ks[t], betas[t]
            lx = widened(lam, fe)  # contains Lam_t
            kl = k.transpose() * lx  # 1 x dv
            decide("v", t, (kl * beta).tolist()[0])
            decide("beta", slice(t, t + 1), [(kl * u.transpose())[0, 0]])
            dk = (lx * u.transpose() - y * kl.transpose()) * beta  # d x 1
            dq = st * gcot[t].transpose() * c
            if spec.qk_l2norm:
                dk = (dk - k * (k.transpose() * dk)[0, 0]) * invk[t]
                dq = (dq - qs[t] * (qs[t].transpose() * dq)[0, 0]) * invq[t]
            decide("k", t, [r[0] for r in dk.tolist()])
            decide("q", t, [r[0] for r in dq.tolist()])
            lp_mid = lam - (k * beta) * (k.transpose() * lam)  # contains (I - b k k^T) Lam^_t
            lp = widened(lp_mid, [(spreads[t] * f).upper() for f in fe])  # contains Lam'_t
            if spec.decay == "gates":
                prods = y.transpose() * lp  # dv x dv: its trace is sum y . Lam'
                decide("g", slice(t, t + 1), [sum((prods[i, i] for i in range(dv)), arb(0))])
            elif spec.decay == "channel-gates":
                prods = y * lp.transpose()  # d x d: its diagonal, sum_c y[m, c] Lam'[m, c]
                decide("g", t, [prods[m, m] for m in range(d)])
            if t == 0:
                if "S0" in shapes:
                    out["S0"][:] = [[decided(a) for a in r] for r in scale_rows(0, lp).tolist()]
                break
            ball = scale_rows(t, lp_mid) + c * qs[t - 1] * gcot[t - 1]
            lam = ball.mid()
            fe = [
                arb((grows[t] * f + r).upper())
                for f, r in zip(fe, _radii(ball, lam, ones_row), strict=True)
            ]
    return out


def _arb_refine_head(x, spec, b, h, go, gs, s0, shapes, prec, max_prec) -> dict[str, np.ndarray]:
    """Head (b, h), each element taken at the first precision p = prec, 2 prec, ... whose
    ball decides it (ReferenceAccuracyError past max_prec)."""
    out = {name: np.full(shape, np.nan) for name, shape in shapes.items()}
    p = prec
    while True:
        if p > max_prec:
            left = {name: int(np.isnan(out[name]).sum()) for name in shapes}
            raise ReferenceAccuracyError(
                f"arb engine (delta-rule gradients): elements of head ({b}, {h}) not "
                f"resolved to float64 at {max_prec} bits (unresolved per gradient: {left})"
            )
        values = _arb_grad_head(x, spec, b, h, p, go, gs, s0, shapes)
        for name in shapes:
            new = np.isnan(out[name])
            out[name][new] = values[name][new]
        if not any(np.isnan(out[name]).any() for name in shapes):
            return out
        p *= 2


def arb_delta_gradients(
    x: AttentionInputs,
    spec: Spec,
    g_out: Any,
    g_state: Any = None,
    initial_state: Any = None,
    prec: int = ARB_PREC,
    max_prec: int = MAX_PREC,
) -> dict[str, np.ndarray]:
    """mp_delta_gradients' result, each element correctly rounded to float64 (the nearest),
    by the recurrences in ball arithmetic (module docstring)."""

    def head(b, h, go, gs, s0, shapes):
        return _arb_refine_head(x, spec, b, h, go, gs, s0, shapes, prec, max_prec)

    return _gradients(x, spec, g_out, g_state, initial_state, head)


def exact_delta_gradients(
    x: AttentionInputs,
    spec: Spec,
    g_out: Any,
    g_state: Any = None,
    initial_state: Any = None,
) -> dict[str, np.ndarray]:
    """The delta rule's exact gradients (mp_delta_gradients' keys and shapes), correctly
    rounded, by arb: faster than mpmath at every size measured on the 2-core machine (4x
    at B = H = N = d = dv = 1, 15x at 2 x 2 x 8 x 4 x 4, 35x at 2 x 2 x 33 x 16 x 16)."""
    return arb_delta_gradients(x, spec, g_out, g_state, initial_state)
