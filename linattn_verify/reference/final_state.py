"""Exact gradients of the final state's loss in the keys and the log-gates, faithfully
rounded to float64 (mpmath), with their magnitudes.

For a causal kernelised spec continuing an initial state (S_0, z_0), the final state is
S_N = diag(W_(N-1)) S_0 + sum_j diag(w_(N-1, j)) phi(k_j) v_j^T, z_N likewise with phi(k_j)
in place of phi(k_j) v_j^T (reference/state.py; W_i the decay from before the first token
to i, w_ij from key j to row i: 1 without a decay, gamma^(i - j), exp(G_i - G_j), or per
feature channel exp(G_im - G_jm)). For the loss L_S = sum(S_N * G_S) (+ sum(z_N * G_z)
when normalised), by the reverse-mode chain rule (Baydin et al. 2018, sec. 3.1):

    r_jm = G_S[m] . v_j + G_z[m]                 (the cotangent key j's feature m meets)
    u_jm = w_(N-1, j, m) r_jm = dL_S/dphi(k_j)_m
    dL_S/dk_j = J_phi(k_j)^T u_j                  (grad_maps.Kernel's Jacobians of the maps)
    dL_S/dg_t = sum_m [W_(N-1, m) c_m + sum_(j<t) phi(k_j)_m u_jm],   c_m = S_0[m] . G_S[m]
                + z_0m G_z[m]

since w_(N-1, j) = exp(G_(N-1) - G_j) depends on g_t for j < t <= N - 1 and W_(N-1) =
exp(G_(N-1)) on every g_t (dL_S/dg_0 = sum_m W_(N-1, m) c_m); for channel gates the sum
over m is dropped, dL_S/dg_tm per channel. fla's backward computes exactly these as dht's
share of dk and dg (fla #1140: the final state's cotangent must reach every input).

Magnitudes M, for the judgement (accuracy/gradient.py), by grad.py's first-order rules:
M(r_jm) = |G_S[m]| . |v_j| + |G_z[m]|, M(u_jm) = w (1 + M(ln w)) M(r_jm) (M(ln w) <= 2
sum_t |g_t| of the largest channel, the prefix sums'), J^T's magnitudes from
grad_maps.Kernel, M(dL_S/dg_t) that of the evaluation through the prefix sums' reverse
cumulative sum (_gate_gradients).

Precision control: every element at p and 2p bits (p = 113 first), accepted where the two
roundings agree within one ulp (grad.agree), recomputed at 4p, ... until MAX_PREC
(ReferenceAccuracyError). Taylor's features (Arora et al. 2024: [1, x', vec(x' x'^T) /
sqrt(2)], x' = x d^(-1/4)) and their Jacobian are written here: grad_maps.Kernel
differentiates taylor through q.k, not its features.
"""

from __future__ import annotations

import mpmath
import numpy as np

from ..inputs import AttentionInputs
from ..specs import Spec, SpecError
from .common import MAX_PREC, ReferenceAccuracyError
from .grad import agree
from .grad_maps import Kernel
from .mp import DEFAULT_PREC, nearest
from .similarity import Similarity


def final_state_gradients(
    x: AttentionInputs,
    spec: Spec,
    g_state: np.ndarray,
    g_z: np.ndarray | None,
    initial: tuple[np.ndarray, np.ndarray | None],
    max_prec: int = MAX_PREC,
    *,
    similarity: Similarity,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """({"k": dL_S/dk (B, H, N, d)} and, for gates, "g": dL_S/dg ((B, H, N), or (B, H, N,
    d) for channel gates), faithfully rounded; the same keys' magnitudes) for the final
    state's loss (module docstring). g_state (B, H, F, dv), g_z (B, H, F) when normalised;
    initial = (S_0, z_0 or None), float64, taken exactly. The weights and the log-gates'
    gradients by the family's `similarity` (final_weights, final_gates)."""
    if spec.no_state:
        raise SpecError(f"final-state gradients are for causal kernelised specs, not {spec}")
    b_, h_ = x.q.shape[:2]
    values: dict[str, list] = {}
    mags: dict[str, list] = {}
    for b in range(b_):
        for h in range(h_):
            head = (g_state[b, h], None if g_z is None else g_z[b, h], initial[0][b, h])
            z0 = None if initial[1] is None else initial[1][b, h]
            value, mag = _refined(x, spec, b, h, (*head, z0), max_prec, similarity)
            for name in value:
                values.setdefault(name, []).append(value[name])
                mags.setdefault(name, []).append(mag[name])
    shape = (b_, h_)
    return (
        {n: np.stack(v).reshape(*shape, *v[0].shape) for n, v in values.items()},
        {n: np.stack(v).reshape(*shape, *v[0].shape) for n, v in mags.items()},
    )


def _refined(x, spec: Spec, b: int, h: int, given: tuple, max_prec: int, sim: Similarity):
    """Head (b, h): the values at p and 2p, p = DEFAULT_PREC, ..., each element accepted
    once two agree; the magnitudes of the first."""
    low, mags = _head(x, spec, b, h, given, DEFAULT_PREC, sim)
    out = {name: np.full(t.shape, np.nan) for name, t in low.items()}
    done = {name: np.zeros(t.shape, dtype=bool) for name, t in low.items()}
    p = DEFAULT_PREC
    while 2 * p <= max_prec:
        high, _ = _head(x, spec, b, h, given, 2 * p, sim)
        for name in out:
            new = ~done[name] & agree(low[name], high[name])
            out[name][new] = high[name][new]
            done[name] |= new
        if all(t.all() for t in done.values()):
            return out, mags
        low, p = high, 2 * p
    left = {name: int((~t).sum()) for name, t in done.items()}
    raise ReferenceAccuracyError(
        f"final-state gradients of head ({b}, {h}) not resolved at {max_prec} bits: {left}"
    )


def _head(x: AttentionInputs, spec: Spec, b: int, h: int, given: tuple, prec: int, sim):
    """({name: values}, {name: magnitudes}) of head (b, h) at `prec` bits."""
    g_s, g_z, s0, z0 = given
    with mpmath.workprec(prec):
        mp = mpmath.mp
        ks = [[mp.mpf(t) for t in row] for row in x.k[b, h].tolist()]
        vs = [[mp.mpf(t) for t in row] for row in x.v[b, h].tolist()]
        side = _Side(spec, ks, x.projection)
        f = len(side.f[0])
        n = len(ks)
        last, spreads, into = sim.final_weights(x, spec, b, h, n, f)
        rows = [[mp.mpf(t) for t in row] for row in g_s.tolist()]
        cols_z = [mp.zero] * f if g_z is None else [mp.mpf(t) for t in g_z.tolist()]
        dk, dk_m, p, p_m = [], [], [], []
        for j in range(n):
            r = [mp.fdot(row, vs[j]) + z for row, z in zip(rows, cols_z, strict=True)]
            rm = [
                mp.fdot([abs(t) for t in row], [abs(t) for t in vs[j]]) + abs(z)
                for row, z in zip(rows, cols_z, strict=True)
            ]
            u = [w * t for w, t in zip(last[j], r, strict=True)]
            um = [w * spreads[j] * t for w, t in zip(last[j], rm, strict=True)]
            grad, grad_m = side.jt(j, u, um)
            dk.append(grad)
            dk_m.append(grad_m)
            p.append([a * t for a, t in zip(side.f[j], u, strict=True)])
            p_m.append([a * t for a, t in zip(side.fm[j], um, strict=True)])
        values, mags = {"k": floats(dk)}, {"k": floats(dk_m)}
        if (gate_rows := sim.final_gates(spec)) is not None:
            z0s = [mp.zero] * f if z0 is None else [mp.mpf(t) for t in z0.tolist()]
            s0s = [[mp.mpf(t) for t in row] for row in s0.tolist()]
            carried = [
                mp.fdot(s_row, g_row) + z * gz
                for s_row, g_row, z, gz in zip(s0s, rows, z0s, cols_z, strict=True)
            ]
            carried_m = [
                mp.fdot([abs(t) for t in s_row], [abs(t) for t in g_row]) + abs(z * gz)
                for s_row, g_row, z, gz in zip(s0s, rows, z0s, cols_z, strict=True)
            ]
            dg, dg_m = _gate_gradients(p, p_m, into, carried, carried_m, spreads[0])
            values["g"], mags["g"] = gate_rows(dg, dg_m)
    return values, mags


def _gate_gradients(p, p_m, into, carried, carried_m, spread):
    """dL_S/dg_tm = W_(N-1, m) c_m + sum_(j<t) p_jm per token and feature, and magnitudes:
    those of the evaluation autograd makes through the prefix sums, dL_S/dg_t = sum_(s>=t)
    dL_S/dG_s with dL_S/dG_s = -p_s + [s = N-1] (W_(N-1) c + sum_j p_j), M = W M(c) +
    sum_j M(p_j) + sum_(s>=t) M(p_s), no smaller than the direct sum's (grad.py's rule for
    dL/dg)."""
    n, f = len(p), len(into)
    total_m = [
        into[m] * spread * carried_m[m] + mpmath.mp.fsum(r[m] for r in p_m) for m in range(f)
    ]
    dg, dg_m = [], []
    running = [into[m] * carried[m] for m in range(f)]
    after = list(total_m)  # total_m + sum_(s>=t) M(p_s), from t = N - 1 down
    suffix = []
    for t in reversed(range(n)):
        after = [a + b for a, b in zip(after, p_m[t], strict=True)]
        suffix.append(after)
    suffix.reverse()
    for t in range(n):
        if t:
            running = [a + b for a, b in zip(running, p[t - 1], strict=True)]
        dg.append(list(running))
        dg_m.append(suffix[t])
    return dg, dg_m


def floats(rows: list) -> np.ndarray:
    """Rows of mpf as a float64 array (each rounded to nearest)."""
    return np.array([[nearest(t) for t in row] for row in rows])


class _Side:
    """The keys' features phi(k_j), their magnitudes, and J_phi(k_j)^T u: grad_maps.Kernel's
    for every map but taylor, whose features and Jacobian are written here."""

    def __init__(self, spec: Spec, ks: list, projection) -> None:
        mp = mpmath.mp
        self.taylor = spec.feature_map == "taylor"
        if self.taylor:
            d = len(ks[0])
            self.root, self.r2 = mp.root(d, 4), 1 / mp.sqrt(2)
            self.scaled = [[t / self.root for t in k] for k in ks]
            self.f = [
                [mp.one, *xs] + [a * c * self.r2 for a in xs for c in xs] for xs in self.scaled
            ]
            self.fm = [[abs(t) for t in row] for row in self.f]
            return
        w = None if projection is None else [[mp.mpf(t) for t in r] for r in projection]
        kernel_spec = Spec(spec.feature_map, causal=True)
        self.kernel = Kernel(kernel_spec, ks[:1], ks, w)
        self.f, self.fm = self.kernel.f["k"], self.kernel.fm["k"]

    def jt(self, j: int, u: list, um: list) -> tuple[list, list]:
        """J_phi(k_j)^T u and its magnitude."""
        if not self.taylor:
            return self.kernel.jt("k", j, u, um)
        xs, d = self.scaled[j], len(self.scaled[j])
        quad = [u[1 + d + a * d : 1 + d + (a + 1) * d] for a in range(d)]  # U (d, d)
        quad_m = [um[1 + d + a * d : 1 + d + (a + 1) * d] for a in range(d)]
        out, mags = [], []
        for a in range(d):  # d/dx_a of x'_a u_a + sum_bc x'_b x'_c U_bc / sqrt(2)
            sym = mpmath.mp.fdot([quad[a][c] + quad[c][a] for c in range(d)], xs)
            sym_m = mpmath.mp.fdot([quad_m[a][c] + quad_m[c][a] for c in range(d)],
                                   [abs(t) for t in xs])  # fmt: skip
            out.append((u[1 + a] + sym * self.r2) / self.root)
            mags.append((um[1 + a] + sym_m * self.r2) / self.root)
        return out, mags
