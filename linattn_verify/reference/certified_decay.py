"""The certified engine's decayed sums: sum_(j<=i) sum_m phi(q_i)_m phi(k_j)_m w_ijm x_j in
float64 at matmul speed, with a rigorous bound on their error (certified.py states the
contract; families/*/fields.py the decays).

Form (Yang et al. 2024, "Gated linear attention", sec. 3.2 and 4.2's secondary chunking):
the log-decays l_t <= 0 (ln gamma, g_t, or g_tm per key channel) are summed only inside
chunks of CHUNK tokens, and inside sub-chunks of SUB tokens, never from the sequence's
start; every factor is exp of a sum of l_t over the tokens between two positions, so each is
at most 1: nothing overflows, and a decay too strong for float64 underflows to 0. A key j
reaches query i through (a) a chunk state: exp(sum over j+1 .. the end of j's chunk), the
state times exp(the chunk's total) for each chunk between (RetNet's recurrence, Sun et al.
2023, eq. 5-6, a chunk at a time), exp(sum over i's chunk's start .. i); (b) the same with
sub-chunks inside one chunk; (c) inside one sub-chunk, exp(sum over j+1 .. i) directly.

Error (per term, Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed.):
- each exponent is a recursive sum of at most CHUNK terms of one sign: relative error
  gamma_e = gamma_CHUNK (Lemma 3.1, eq. 3.5), times (1 + LIB) for ln gamma's own rounding;
  a term's exponents add up to y_ij = -ln w_ij, so the computed weight is
  w exp(phi), |phi| <= gamma_e y;
- the exponentials (at most K = chunks + CHUNK / SUB + 2 on a path, LIB each), the products
  and the additions on a term's path (at most D, `path_depth`) multiply it by (1 + theta),
  |theta| <= rho = (1 + gamma_D) (1 + LIB)^K - 1 (eq. 3.2's products of (1 + delta));
- the exponent's error is relative to y, not to 1: w (exp(a y) - 1) <= a y exp(-(1 - a) y)
  <= (2 a / e) / (1 - 2 a) sqrt(w) = c_h(a) sqrt(w), so that it is bounded by a sum with
  the weights sqrt(w): the chain H, run with the log-decays times HALF < 1/2, whose computed
  exponents are at least -y/2 (so its weights at least sqrt(w)), of |phi(q)| + psi and
  |phi(k)| + psi, psi the features' error bounds.
Then, with E_f = (|phi^(q)| + psi_q).(|phi^(k)| + psi_k) - |phi^(q)|.|phi^(k)| (the
features' error) and F = |phi^(q)|.|phi^(k)| + E_f, a term's error is at most
w |x| ((1 + rho) E_f + rho F) + 2 (1 + rho) F w (exp(gamma_e y) - 1), and sums of w Y are
bounded from the computed sums of the same chains (their weights err the same way):
sum w Y <= (computed + (1 + rho) c_h H) / (1 - rho), c_h = c_h(2 gamma_e). Underflow
(gradual: an absolute error of at most UNDERFLOW per operation, times the later factors,
the largest features and values, the decays at most 1) adds an absolute term per sum.

one_sided_sums gives upper or lower bounds on such sums of non-negative terms (the a-priori
bound's, accuracy/bound.py) from the same form run on log-decays scaled so that every
computed factor is on one side of the exact one: within about rho of the exact sums.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ..specs import Spec
from .certified import (
    LIB,
    RELATIVE,
    SAFETY,
    UNDERFLOW,
    Features,
    Lefts,
    Rights,
    float_features,
    gamma64,
)

CHUNK = 128  # tokens per chunk: the state is carried between chunks
SUB = 16  # tokens per sub-chunk inside a chunk (CHUNK a multiple of SUB)
GROUP = 16  # chunks per streamed step
# Below this a feature's error bound is taken as absolute (it may have underflowed)
TINY = 2.0**-1000
# The half-decay factor: 2 HALF (1 + gamma_e)(1 + u) <= 1 for CHUNK < 2^13, so that the
# chain H's computed exponents are at least half the exact ones
HALF = 0.5 - 2.0**-40
# Covers a short formula's rounding on non-negative float64 numbers, up to 2^12 operations:
# (1 + u)^(2^12) < 1 + 2^-40 (SAFETY's 2^-20 would put 1e-6 on upper bounds kept tight)
FEW_ROUNDINGS = 1 + 2.0**-40


def path_depth(m: int, n_keys: int) -> tuple[int, int]:
    """(D, K): the roundings (additions and products) and the exponentials on a term's
    path: m features, CHUNK keys of a chunk's state (SUB of a sub-chunk's), the states'
    additions and products between chunks and sub-chunks, the three parts added, the
    features' own upper bounds (H) and the query and key factors."""
    chunks, subs = -(-n_keys // CHUNK), CHUNK // SUB
    return m + CHUNK + SUB + 2 * (chunks + subs) + 12, chunks + subs + 2


def path_errors(m: int, n_keys: int) -> tuple[float, int]:
    """(rho, ops): a term's relative error on its path, rho = (1 + gamma_D)(1 + LIB)^K - 1
    (Higham 2002, Lemma 3.1: D roundings and K exponentials, path_depth), and its
    operations, D + K, each of which may underflow instead."""
    depth, exps = path_depth(m, n_keys)
    return (gamma64(depth) + (1 + gamma64(depth)) * math.expm1(exps * LIB)) * SAFETY, depth + exps


def log_decays(decay: np.ndarray, n: int) -> tuple[np.ndarray, float]:
    """(l (N, 1) or (N, d): ln w_t per token (and key channel), gamma_e: the relative error
    of a computed sum of at most CHUNK of them) for one head's decay as reference.balls.Head
    holds it: ln gamma (within LIB) of a gamma (0-d), the log-gates themselves ((N,) or
    (N, d)) otherwise."""
    if np.ndim(decay) == 0:
        logs, rel = np.full((n, 1), np.log(np.float64(decay))), LIB
    else:
        logs, rel = decay.reshape(n, -1), 0.0
    return logs, ((1 + rel) * (1 + gamma64(CHUNK)) - 1) * SAFETY


@dataclass(frozen=True)
class Factors:
    """The decay factors of a step's rows (padded to whole chunks), each exp(x), x <= 0:
    per chunk (c, CHUNK, F) and sub-chunk (c, s, SUB, F) the prefix (start .. i) and
    suffix (j+1 .. end) factors, the totals (c, F) and (c, s, F), and inside a sub-chunk
    exp(sum over j+1 .. i) (c, s, SUB, SUB, F), 0 for j > i."""

    pre: np.ndarray
    suf: np.ndarray
    tot: np.ndarray
    pre2: np.ndarray
    suf2: np.ndarray
    tot2: np.ndarray
    diag: np.ndarray

    @classmethod
    def of(cls, logs: np.ndarray) -> Factors:
        """From the log-decays (n, F), n a multiple of CHUNK."""
        x = logs.reshape(-1, CHUNK, logs.shape[1])
        pre, suf, tot = _local(x)
        x2 = x.reshape(x.shape[0], -1, SUB, x.shape[2])
        pre2, suf2, tot2 = _local(x2)
        seg = np.zeros((*x2.shape[:3], SUB, x2.shape[3]))  # (.., i, j, F)
        for i in range(1, SUB):  # sum_(t=j+1..i) l_t for j < i, recursively
            seg[..., i, :i, :] = seg[..., i - 1, :i, :] + x2[..., i, None, :]
        np.exp(seg, out=seg)
        seg *= np.tri(SUB)[:, :, None]
        return cls(pre, suf, tot, pre2, suf2, tot2, seg)


def _local(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """exp of the inclusive prefix sums, of the exclusive suffix sums (t > j) and of the
    total of x (..., L, F) along L, each a recursive sum of one sign."""
    pre = np.cumsum(x, axis=-2)
    suf = np.zeros_like(x)
    suf[..., :-1, :] = np.cumsum(x[..., :0:-1, :], axis=-2)[..., ::-1, :]
    return np.exp(pre), np.exp(suf), np.exp(pre[..., -1, :])


def chain(
    f: Factors, left: np.ndarray, right: np.ndarray, cols: np.ndarray, state: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(sum_(j<=i) sum_m left_im right_jm w_ijm cols_j for the step's rows, plus the
    entering state's part; the state after the step, (m, columns)): the module's form."""
    n = left.shape[0]
    lc, rc, xc = (_padded(a, f.pre.shape[0] * CHUNK) for a in (left, right, cols))
    partial = np.matmul((rc * f.suf).transpose(0, 2, 1), xc)  # (chunks, m, columns)
    before = np.empty_like(partial)
    for c in range(partial.shape[0]):  # S_c = exp(T_c) S_(c-1) + P_c
        before[c] = state
        state = f.tot[c][:, None] * state + partial[c]
    out = np.matmul(lc * f.pre, before)
    chunks, subs = f.pre2.shape[:2]
    l2, r2, x2 = (a.reshape(chunks, subs, SUB, a.shape[-1]) for a in (lc, rc, xc))
    # the sub-chunks' states transposed, (chunks, subs, columns, m): numpy's batched matmul
    # is slow on a transposed first operand
    partial2 = np.matmul(x2.swapaxes(-1, -2), r2 * f.suf2)
    before2 = np.empty_like(partial2)
    inner_state = np.zeros_like(partial2[:, 0])
    for s in range(subs):
        before2[:, s] = inner_state
        inner_state = f.tot2[:, s, None, :] * inner_state + partial2[:, s]
    out += np.matmul(l2 * f.pre2, before2.swapaxes(-1, -2)).reshape(out.shape)
    if f.diag.shape[-1] == 1:  # one weight per token: the similarities times it
        inner = np.matmul(l2, r2.swapaxes(-1, -2)) * f.diag[..., 0]
    else:  # per channel: sum_m l_im (r_jm w_ijm)
        weighted = (f.diag * r2[..., None, :, :]).swapaxes(-1, -2)  # (.., i, m, j)
        inner = np.matmul(l2[..., :, None, :], weighted)[..., 0, :]
    out += np.matmul(inner, x2).reshape(out.shape)
    return out.reshape(-1, cols.shape[1])[:n], state


def _padded(a: np.ndarray, n: int) -> np.ndarray:
    """a (rows, columns) with zero rows to n, as (n / CHUNK, CHUNK, columns)."""
    if a.shape[0] < n:
        a = np.concatenate([a, np.zeros((n - a.shape[0], a.shape[1]))])
    return a.reshape(-1, CHUNK, a.shape[1])


@dataclass
class Maxima:
    """Running maxima over the keys and values met so far (a causal row depends on no
    later ones): r, the largest relative error of a feature of |phi| >= TINY (queries'
    too); a_k, the largest absolute error of a key feature below it; the largest |phi(k)|
    and |v|."""

    r: float = 0.0
    a_k: float = 0.0
    top_k: float = 0.0
    top_v: np.ndarray | float = 0.0  # per column of v
    prefix_v: np.ndarray | None = None  # max_(t<=i) |v_tc| for the step's rows i

    def meet(self, fq: Features, fk: Features, v: np.ndarray) -> None:
        for f in (fq, fk):
            a = np.abs(f.phi)
            with np.errstate(divide="ignore", invalid="ignore"):
                self.r = max(self.r, float(np.max(f.err / a, where=a >= TINY, initial=0.0)))
        self.a_k = max(self.a_k, float(np.max(fk.err, where=np.abs(fk.phi) < TINY, initial=0.0)))
        self.top_k = max(self.top_k, float(np.abs(fk.phi).max()))
        before = np.broadcast_to(self.top_v, (1, v.shape[1]))
        self.prefix_v = np.maximum.accumulate(np.vstack([before, np.abs(v)]))[1:]
        self.top_v = self.prefix_v[-1]


def decayed_sums(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    w: np.ndarray | None,
    decay: np.ndarray,
    spec: Spec,
    given: tuple[Features, Features] | None = None,
) -> Iterator[tuple[int, int, np.ndarray, np.ndarray, np.ndarray]]:
    """Per step of query rows: (start, stop, the sums [sum_j w_ij sim_ij v_j, sum_j w_ij
    sim_ij], a bound on their error, a bound on sum_j w_ij |phi(q_i)|.|phi(k_j)| [|v_j|, 1])
    of one head of a decayed spec, unscaled (the module's bound). given: the features of
    q's and k's rows (values and error bounds, of the spec's map) in place of
    float_features', q and k then unused."""
    n, dv, name = v.shape[0], v.shape[1], spec.feature_map
    logs, gamma_e = log_decays(decay, n)
    if given is None:
        m = spec.info.feature_dim(q.shape[1], None if w is None else w.shape[0])
    else:
        m = given[0].phi.shape[1]
    relative = name in RELATIVE
    width = m if relative else 2 * m  # the features of a term (E: [psi, |phi|])
    rho, ops = path_errors(width, n)
    a_h = 2 * gamma_e
    c_h = (2 * a_h / math.e) / (1 - 2 * a_h) * SAFETY
    positive = spec.info.nonnegative_features
    seen = Maxima()
    support = np.zeros((1, m), dtype=bool)  # the key features possibly nonzero so far
    states: dict[str, np.ndarray] = {}
    step = CHUNK * GROUP
    for start in range(0, n, step):
        stop = min(start + step, n)
        rows = np.arange(start, stop)
        if given is None:
            fq = float_features(q[start:stop], rows, n, w, name)
            fk = float_features(k[start:stop], rows, n, w, name)
        else:
            fq, fk = (Features(f.phi[start:stop], f.err[start:stop]) for f in given)
        vb = v[start:stop]
        seen.meet(fq, fk, vb)
        padded = _padded(logs[start:stop], -(-(stop - start) // CHUNK) * CHUNK)
        value_f = Factors.of(padded.reshape(-1, logs.shape[1]))
        half_f = Factors.of(padded.reshape(-1, logs.shape[1]) * HALF)
        aq, ak, av, ones = np.abs(fq.phi), np.abs(fk.phi), np.abs(vb), np.ones((stop - start, 1))
        mags = np.concatenate([av, ones], 1)
        chains = {"H": (half_f, aq + fq.err, ak + fk.err, ones)}  # name: (factors, l, r, x)
        if positive:
            chains["V"] = (value_f, fq.phi, fk.phi, np.concatenate([vb, av, ones], 1))
        else:
            chains["V"] = (value_f, fq.phi, fk.phi, np.concatenate([vb, ones], 1))
            chains["M"] = (value_f, aq, ak, mags)
        if not relative:
            left = np.concatenate([fq.err, aq], 1)
            chains["E"] = (value_f, left, np.concatenate([ak + fk.err, fk.err], 1), mags)
        sums = {}
        for key, (f, left, right, cols) in chains.items():
            state = states.get(key, np.zeros((left.shape[1], cols.shape[1])))
            with np.errstate(over="ignore", invalid="ignore"):  # inf features: bound inf
                sums[key], states[key] = chain(f, left, right, cols, state)
        value = sums["V"][:, [*range(dv), -1]]
        magnitude = sums["V"][:, dv:] if positive else sums["M"]
        touches, support = _touching(aq + fq.err, ak + fk.err, support)
        big_q = np.where(touches, np.max(aq + fq.err, axis=1), 0.0)
        a_q = np.where(touches, np.max(fq.err, where=aq < TINY, initial=0.0, axis=1), 0.0)
        rows_q = (big_q, a_q)
        bounds = _errors(sums, magnitude, seen, rows_q, (rho, c_h), (width, n, ops))
        yield start, stop, value, *bounds


def _errors(sums, magnitude, seen: Maxima, rows_q, factors, sizes):
    """(the bound on the value sums' error, the bound A on sum_j w |phi(q)|.|phi(k)|
    [|v|, 1]) from the chains' computed sums (module docstring); rows_q: per row, the
    largest |phi(q_i)| + psi (0 where no feature of q_i that may be nonzero meets one of a
    key j <= i: every term is then exactly 0, computed and exact) and error of a feature
    below TINY; factors (rho, c_h); sizes (m, n, the operations on a path). The absolute
    terms: an underflowing operation errs by UNDERFLOW at most, times the later factors,
    at most max(|phi(q_i)| + psi, 1) max(|phi(k)| + psi, 1) max(|v|, 1)."""
    (rho, c_h), (m, n, ops) = factors, sizes
    big_q, a_q = rows_q
    big_k = (1 + seen.r) * seen.top_k + seen.a_k
    columns = np.append(seen.top_v, 1.0)  # the largest |v_jc| so far, and 1
    later = max(big_k, 1.0) * max(columns.max(), 1.0) * np.maximum(big_q, 1.0)
    tiny = np.where(big_q > 0, _underflow(ops, m, n, later), 0.0)[:, None]
    prefix = np.concatenate([seen.prefix_v, np.ones((seen.prefix_v.shape[0], 1))], 1)
    h = sums["H"] * prefix / (1 - rho) * SAFETY + tiny  # |v_jc| <= max_(t<=i) |v_tc|
    grown = (1 + rho) * c_h * h
    bound_a = (magnitude + grown) / (1 - rho) * SAFETY + tiny
    if "E" in sums:
        bound_e = (sums["E"] + grown) / (1 - rho) * SAFETY + tiny
        bound_f = bound_a + bound_e
    else:  # E_f <= (2 r + r^2) |phi^(q)|.|phi^(k)| + a_q (|phi^(k)| + psi) + (..) a_k
        absolute = m * n * (a_q * big_k + big_q * seen.a_k)[:, None] * columns * SAFETY
        bound_e = (2 * seen.r + seen.r * seen.r) * bound_a + absolute
        bound_f = (1 + seen.r) ** 2 * bound_a + absolute
    total = (1 + rho) * bound_e + rho * bound_f + 2 * (1 + rho) * c_h * h
    return total * SAFETY + tiny, bound_a


def _touching(left: np.ndarray, right: np.ndarray, support: np.ndarray):
    """(per row i, whether a feature of left_i may be nonzero where one of right_j is, for
    some key j <= i; the features of right possibly nonzero so far, (1, m)) from the
    step's rows and `support`, the same before them. Where a row touches nothing, every
    term of its sums is exactly 0, computed (products with 0, no key after i) and exact."""
    support = np.logical_or.accumulate(np.vstack([support, right > 0]))[1:]
    return np.any((left > 0) & support, axis=1), support[-1:]


def _underflow(ops: int, m: int, n: int, later: np.ndarray) -> np.ndarray:
    """The absolute error gradual underflow may add to a sum of m n terms whose paths have
    `ops` operations: UNDERFLOW per operation, times `later`, a bound on the factors after
    it (features, values; the decay factors are at most 1)."""
    return ops * UNDERFLOW * m * n * later * SAFETY


def one_sided_sums(
    lefts: Lefts, rights: Rights, logs: np.ndarray, gamma_e: float, upper: bool = True
) -> Iterator[tuple[int, int, list[np.ndarray]]]:
    """Per step of rows: (start, stop, [an upper (or lower) bound on S_ic = sum_(j<=i)
    sum_m left_im right_jm w_ijm cols_jc for each chain]), for chains of non-negative
    float64 numbers (lefts, rights as certified.streamed_sums'), w the exact decay weights of
    the log-decays l (log_decays' (logs, gamma_e) for one head, (N, 1) or (N, m) per
    channel): w_ijm = exp(-y_ijm), y_ijm = -(l_(j+1),m + ... + l_im).

    The module's form runs on the log-decays times s = fl(1 - 4 gamma_e) for the upper
    bounds, fl(1 + 4 gamma_e) for the lower. A computed exponent is a recursive sum of at
    most CHUNK terms fl(s l_t) of one sign over a segment P of the path from j to i, within
    gamma_e (log_decays) of the exact sum of its terms (Higham 2002, Lemma 3.1 and eq. 3.5:
    |s^ - s| <= gamma_(n-1) sum |x_t|): upper, at most (1 - 4 gamma_e)(1 + u)^2 (1 +
    gamma_e) y_P <= y_P in magnitude; lower, at least (1 + 4 gamma_e)(1 - u)^2 (1 -
    gamma_e) y_P >= y_P (u <= gamma_e < 1/12). So each computed factor, exp of it within
    LIB, is at least exp(-y_P)(1 - LIB) (at most exp(-y_P)(1 + LIB); one_sided_factors),
    and the K on a path multiply to at least w_ij (1 - LIB)^K (at most w_ij (1 + LIB)^K).
    The terms are non-negative: every rounding on a term's path (D, path_depth) multiplies
    it by a factor in [1 - u, 1 + u], so the computed sum is within [1 - rho, 1 + rho]
    times the sum of the terms with the computed weights, rho = (1 + gamma_D)(1 + LIB)^K - 1
    (>= 1 - (1 - u)^D (1 - LIB)^K: path_errors; Higham 2002, Lemma 3.1), unless an operation
    underflows: then an absolute UNDERFLOW each (_underflow), times the factors after it,
    at most max(left_i, 1) max(right, 1) max(cols_c, 1) (0 where no term can be nonzero:
    _touching, or column c zero so far). So S_ic <= (computed + underflow) / (1 - rho), and
    S_ic >= max((computed - underflow) / (1 + rho), 0), in FEW_ROUNDINGS. Each errs by about
    rho + 5 gamma_e y on the terms of exponent y: below 1e-10 relative at N = 2^20 while the
    weights that matter exceed 1e-300."""
    n, channels = logs.shape
    carried: list[_Carried] = []  # per chain
    for start in range(0, n, CHUNK * GROUP):
        stop = min(start + CHUNK * GROUP, n)
        padded = _padded(logs[start:stop], -(-(stop - start) // CHUNK) * CHUNK)
        factors = one_sided_factors(padded.reshape(-1, channels), gamma_e, upper)
        chains = list(zip(lefts(start, stop), rights(start, stop), strict=True))
        carried = carried or [_Carried.empty(left, cols) for left, (_, cols) in chains]
        bounds = [
            _one_sided_step(factors, left, right, cols, c, n, upper)
            for (left, (right, cols)), c in zip(chains, carried, strict=True)
        ]
        yield start, stop, bounds


def one_sided_factors(logs: np.ndarray, gamma_e: float, upper: bool) -> Factors:
    """Factors.of the log-decays (n, F), n a multiple of CHUNK, times fl(1 - 4 gamma_e)
    (upper) or fl(1 + 4 gamma_e): each factor at least (at most) exp of the exact sum of
    its log-decays times 1 - LIB (1 + LIB) (one_sided_sums)."""
    return Factors.of(logs * (1 - 4 * gamma_e if upper else 1 + 4 * gamma_e))


@dataclass
class _Carried:
    """One chain of one_sided_sums between steps: its state, the right features possibly
    nonzero so far (_touching), the largest right feature and each column's largest."""

    state: np.ndarray
    support: np.ndarray
    top_right: float
    top_cols: np.ndarray

    @classmethod
    def empty(cls, left: np.ndarray, cols: np.ndarray) -> _Carried:
        m, c = left.shape[1], cols.shape[1]
        return cls(np.zeros((m, c)), np.zeros((1, m), dtype=bool), 0.0, np.zeros((1, c)))


def _one_sided_step(f: Factors, left, right, cols, carried: _Carried, n: int, upper: bool):
    """one_sided_sums' bound for one chain and step, carrying its state on."""
    with np.errstate(over="ignore", invalid="ignore"):  # inf features: bound inf
        sums, carried.state = chain(f, left, right, cols, carried.state)
    touches, carried.support = _touching(left, right, carried.support)
    carried.top_right = max(carried.top_right, float(right.max(initial=0.0)))
    prefix = np.maximum.accumulate(np.vstack([carried.top_cols, cols]))[1:]
    carried.top_cols = prefix[-1:]
    m = left.shape[1]
    rho, ops = path_errors(m, n)
    later = np.maximum(left.max(axis=1, initial=0.0), 1.0)[:, None] * np.maximum(prefix, 1.0)
    with np.errstate(over="ignore", invalid="ignore"):
        later *= max(carried.top_right, 1.0)
        tiny = np.where(touches[:, None] & (prefix > 0), _underflow(ops, m, n, later), 0.0)
        if upper:
            return (sums + tiny) / (1 - rho) * FEW_ROUNDINGS
        return np.maximum((sums - tiny) / (1 + rho) / FEW_ROUNDINGS, 0.0)
