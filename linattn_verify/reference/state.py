"""The exact state of a causal kernelised spec after its last token, faithfully rounded to
float64: S = sum_j w_j phi(k_j) v_j^T and z = sum_j w_j phi(k_j) (Katharopoulos et al. 2020,
eq. 18-20; w_j = 1, or with a decay w_(N-1, j): Sun et al. 2023, eq. 6; Yang et al. 2024,
eq. 3), phi the spec's feature map (balls.features: the order of the features is the
spec's); the spec's scale is the queries', not the state's. In ball arithmetic: every
element is accepted once its ball determines its float64 rounding, else the head is
recomputed at twice the precision (arb.rounded)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from flint import arb, arb_mat

from ..inputs import AttentionInputs
from ..specs import RSQRT_D, Spec, SpecError, summing
from .arb import DEFAULT_PREC, rounded
from .balls import Head, balls, features, working_precision
from .common import MAX_PREC, ReferenceAccuracyError
from .similarity import Similarity


def _head_state(head: Head, spec: Spec, prec: int, sim: Similarity) -> list[list[float | None]]:
    """[S | z] (F, dv + 1) of one head at `prec` bits, None where not yet resolved."""
    n = head.k.shape[0]
    with working_precision(prec):
        rows = features(head.k, range(n), head, spec.feature_map)
        fk = arb_mat(sim.state_keys(head, spec, rows))
        right = arb_mat([[*row, arb(1)] for row in balls(head.v)])
        sums = (fk.transpose() * right).tolist()
    return [[rounded(t) for t in row] for row in sums]


def exact_state(
    x: AttentionInputs,
    spec: Spec,
    similarity: Similarity,
    prec: int = DEFAULT_PREC,
    max_prec: int = MAX_PREC,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(S (B, H, F, dv), z (B, H, F)) over every key of x, in float64, the weights by the
    family's `similarity` (a kernelised spec's; families.exact_state takes every family's)."""
    summing(spec, "exact states")
    if no_state := Spec(spec.feature_map, causal=True).no_state:  # the state after every key
        raise SpecError(no_state)
    (b_, h_), sim = x.k.shape[:2], similarity
    heads = [
        np.array(_resolved(lambda p, b=b, h=h: (_head_state(Head.of(x, b, h), spec, p, sim),),
                           f"the state of head ({b}, {h})", prec, max_prec)[0])
        for b in range(b_)
        for h in range(h_)
    ]  # fmt: skip
    sz = np.stack(heads).reshape(b_, h_, *heads[0].shape)
    return sz[..., :-1], sz[..., -1]


class StateGradients(NamedTuple):
    """exact_state_gradients' result, each faithfully rounded to float64: dL/dS_0
    (B, H, F, dv), dL/dz_0 (B, H, F; None unnormalised), dL_S/dv (B, H, N, dv), and the
    continued sequence's exact denominators eps + D_i (B, H, N; None unnormalised) and
    outputs (B, H, N, dv; None unnormalised), which its bound needs."""

    s0: np.ndarray
    z0: np.ndarray | None
    v: np.ndarray
    den: np.ndarray | None
    out: np.ndarray | None


def exact_state_gradients(
    x: AttentionInputs,
    spec: Spec,
    g_out: np.ndarray,
    g_state: np.ndarray,
    g_z: np.ndarray | None = None,
    initial: tuple[np.ndarray, np.ndarray] | None = None,
    prec: int = DEFAULT_PREC,
    max_prec: int = MAX_PREC,
    *,
    similarity: Similarity,
) -> StateGradients:
    """For a causal spec continuing an initial state, and the loss L = sum(out * g_out) +
    sum(S_N * g_state) (+ sum(z_N * g_z) when normalised; S_N, z_N the final state):
    dL/dS_0, dL/dz_0 and dL_S/dv, L_S = sum(S_N * g_state) alone (StateGradients).

    n_i = c phi(q_i)^T (W_i S_0 + sum_(j<=i) w_ij phi(k_j) v_j^T), D_i = eps + c phi(q_i)^T
    (W_i z_0 + sum_(j<=i) w_ij phi(k_j)), out_i = n_i / D_i (n_i unnormalised, D_i = 1);
    S_N = W_(N-1) S_0 + sum_j w_(N-1, j) phi(k_j) v_j^T, z_N likewise; W_i = w_(i, -1) the
    decay from before the first token to i (exp(G_i), gamma^(i + 1); 1 without a decay).
    By the chain rule (the quotient rule on n_i / D_i):
    dL/dS_0 = sum_i c W_i phi(q_i) (g_out_i / D_i)^T + W_(N-1) g_state (the final state's
    cotangent, fla's dht, flows into dh0), dL/dz_0 = -sum_i c W_i phi(q_i) (g_out_i .
    out_i) / D_i + W_(N-1) g_z, and dL_S/dv_j = w_(N-1, j) g_state^T phi(k_j). Unnormalised
    the gradients do not depend on the initial state; normalised, `initial` = (S_0, z_0) is
    required (float64, taken exactly). The weights by the family's `similarity`."""
    if spec.no_state:
        raise SpecError(f"exact state gradients are for causal kernelised specs, not {spec}")
    if spec.normalize and (initial is None or g_z is None):
        raise SpecError("a normalised spec's state gradients need initial = (S_0, z_0) and g_z")
    b_, h_ = x.q.shape[:2]
    heads = []
    for b in range(b_):
        for h in range(h_):
            given = None if not spec.normalize else (initial[0][b, h], initial[1][b, h], g_z[b, h])
            heads.append(_resolved(
                lambda p, b=b, h=h, given=given: _head_state_gradients(
                    Head.of(x, b, h), spec, g_out[b, h], g_state[b, h], given, p, (b, h),
                    similarity,
                ),
                f"the state gradients of head ({b}, {h})", prec, max_prec,
            ))  # fmt: skip

    def stacked(part: int, squeeze: bool = False) -> np.ndarray:
        arrays = [np.array(head[part], dtype=np.float64) for head in heads]
        arrays = [a[:, 0] for a in arrays] if squeeze else arrays
        return np.stack(arrays).reshape(b_, h_, *arrays[0].shape)

    if not spec.normalize:
        return StateGradients(stacked(0), None, stacked(1), None, None)
    return StateGradients(stacked(0), stacked(2, True), stacked(1), stacked(3, True), stacked(4))


def _resolved(compute, what: str, prec: int, max_prec: int) -> tuple:
    """compute(p) -> tables of floats (None where not resolved) at p = prec, 2 prec, ...
    until every entry is resolved; ReferenceAccuracyError past max_prec."""
    while prec <= max_prec:
        tables = compute(prec)
        if all(t is not None for table in tables for row in table for t in row):
            return tables
        prec *= 2
    raise ReferenceAccuracyError(f"{what} is not resolved at {max_prec} bits")


def _head_state_gradients(
    head: Head, spec: Spec, g_out, g_state, given, prec: int, at, sim: Similarity
):
    """One head at `prec` bits, None where not yet resolved: (dL/dS_0, dL_S/dv), then
    normalised (dL/dz_0, eps + D_i, out_i) as columns; given: (S_0, z_0, g_z) of a
    normalised spec; at: the head's (b, h), for messages."""
    n, d = head.q.shape
    with working_precision(prec):
        c = arb(d).rsqrt() if spec.scale == RSQRT_D else arb(spec.scale)
        fq = features(head.q, range(n), head, spec.feature_map)
        fk = features(head.k, range(n), head, spec.feature_map)
        into = sim.from_start(head, spec, len(fk[0]))  # W_im
        last = [[end / t for end, t in zip(into[-1], row, strict=True)] for row in into]
        left = arb_mat([[c * e * t for e, t in zip(into[i], fq[i])] for i in range(n)])
        keys = arb_mat([[e * t for e, t in zip(last[j], fk[j])] for j in range(n)])
        dv = keys * arb_mat(balls(g_state))
        carried = arb_mat([[e * t for t in row] for e, row in zip(into[-1], balls(g_state))])
        if given is None:
            ds = left.transpose() * arb_mat(balls(g_out)) + carried
            return tuple(_rounded(m) for m in (ds, dv))
        s0, z0, g_z = given
        sims, weights = sim.causal_sims(head, spec, fq, fk)
        sim = arb_mat([[c * s * w for s, w in zip(r, wr)] for r, wr in zip(sims, weights)])
        vz = arb_mat([[*row, arb(1)] for row in balls(head.v)])
        s0z = arb_mat([[*row, arb(z)] for row, z in zip(balls(s0), z0.tolist())])
        sums = (sim * vz + left * s0z).tolist()
        dens = [row[-1] + spec.eps for row in sums]
        if zero := [i for i, den in enumerate(dens) if den.is_exact() and den == 0]:
            raise ReferenceAccuracyError(
                f"the exact denominator of row (b, h, i) = {(*at, zero[0])} is 0 (0/0)"
            )
        outs = [[t / den for t in row[:-1]] for row, den in zip(sums, dens)]
        gs = balls(g_out)
        scaled = arb_mat([[t / den for t in row] for row, den in zip(gs, dens)])
        dots = arb_mat([[-sum((t * o for t, o in zip(row, out)), arb(0))]
                        for row, out in zip(scaled.tolist(), outs)])  # fmt: skip
        ds = left.transpose() * scaled + carried
        dz = left.transpose() * dots + arb_mat([[e * t] for e, t in zip(into[-1], g_z.tolist())])
        columns = arb_mat([[den] for den in dens])
        return tuple(_rounded(m) for m in (ds, dv, dz, columns, arb_mat(outs)))


def _rounded(m: arb_mat) -> list[list[float | None]]:
    return [[rounded(t) for t in row] for row in m.tolist()]
