"""The a-priori bound's fast engine (accuracy/bound.py, _fast_sums) for every kernelised
spec: scaled, unnormalised, decayed (constant, gates, channel gates), with eps. Against the
ball-arithmetic engine on small random cases that cross certified_decay's chunks,
sub-chunks and steps: never below it (the scale s, and the bound on the absolute error,
bound u s) and within 1e-6 of it; certified_decay.one_sided_sums against exact sums in arb;
the engine each spec gets."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flint import arb

from linattn_verify.accuracy import bound
from linattn_verify.accuracy.bound import denominator_condition, scale_and_bound
from linattn_verify.families import validate
from linattn_verify.families.decayed import bound as decayed_bound
from linattn_verify.inputs import UNIT_ROUNDOFF
from linattn_verify.reference import certified
from linattn_verify.reference import certified_decay as decayed
from linattn_verify.reference.balls import working_precision
from linattn_verify.specs import RSQRT_D, Spec, SpecError

TIGHT = 1e-6  # the fast bound and scale within this of the arb engine's (observed < 1e-10)
ROUNDING = 1e-14  # _bound_rows' own float64 rounding, the same in both engines

# (feature map, decay, normalize, scale, eps, kind of decay, N): every decay with the
# channel-gated maps, the scalar decays with the others, no decay with scales; gates
# strong (-50 a token: factors underflow inside a chunk), weak (-1e-6), gamma 1 - 2^-40
CASES = [
    ("elu", "constant", True, 1.0, 0.0, "normal", 70),
    ("elu", "constant", True, RSQRT_D, 1e-6, "near-one", 45),
    ("relu", "constant", False, 0.3, 0.0, "strong", 70),
    ("identity", "constant", True, 1.0, 1e-6, "normal", 40),
    ("elu", "gates", False, RSQRT_D, 0.0, "strong", 70),
    ("relu", "gates", True, 1.0, 1e-6, "weak", 70),
    ("identity", "gates", False, RSQRT_D, 0.0, "normal", 260),
    ("identity", "gates", True, 0.3, 1e-6, "strong", 40),
    ("elu", "channel-gates", True, RSQRT_D, 0.0, "normal", 130),
    ("elu", "channel-gates", False, 1.0, 0.0, "weak", 70),
    ("relu", "channel-gates", True, 0.3, 0.0, "strong", 70),
    ("identity", "channel-gates", False, RSQRT_D, 0.0, "strong", 70),
    ("identity", "channel-gates", True, 1.0, 1e-6, "normal", 40),
    ("performer-positive", "gates", True, RSQRT_D, 0.0, "normal", 70),
    ("performer-positive", "constant", False, 1.0, 0.0, "near-one", 40),
    ("performer-trig", "constant", False, 0.3, 0.0, "normal", 40),
    ("taylor", "gates", True, 0.3, 0.0, "weak", 40),
    ("taylor", "constant", False, RSQRT_D, 0.0, "strong", 40),
    ("cosformer", None, False, 0.3, 0.0, "normal", 70),
    ("elu", None, False, RSQRT_D, 0.0, "normal", 70),
    ("identity", None, True, 0.3, 1e-6, "normal", 70),
    ("relu", None, True, RSQRT_D, 0.0, "normal", 70),
]


@pytest.fixture
def small_chunks(monkeypatch):
    """certified_decay's chunks of 16 tokens, sub-chunks of 4, 2 chunks per step, and
    certified's of 8 rows, 2 per step: N = 40 crosses sub-chunks, chunks and steps."""
    monkeypatch.setattr(decayed, "CHUNK", 16)
    monkeypatch.setattr(decayed, "SUB", 4)
    monkeypatch.setattr(decayed, "GROUP", 2)
    monkeypatch.setattr(certified, "CHUNK", 8)
    monkeypatch.setattr(certified, "GROUP", 2)
    monkeypatch.setattr(certified, "STEP", 16)


def _decay(kind: str, decay: str | None, rng, shape: tuple[int, ...]) -> np.ndarray | None:
    """gamma (H,) or log-gates (B, H, N[, d]) of one kind."""
    b, h, n, d = shape
    if decay is None:
        return None
    if decay == "constant":
        return {"near-one": np.full(h, 1 - 2.0**-40), "strong": np.full(h, 1e-30)}.get(
            kind, rng.uniform(0.7, 0.99, h)
        )
    size = (b, h, n) if decay == "gates" else (b, h, n, d)
    return {"strong": np.full(size, -50.0), "weak": np.full(size, -1e-6)}.get(
        kind, -rng.exponential(0.2, size)
    )


def _inputs(spec: Spec, kind: str, n: int, seed: int, d: int = 4):
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(2, 1, 2, n, d))
    v = rng.normal(0.5, 1.0, size=(1, 2, n, 3))
    if spec.feature_map == "relu":  # rows without a positive feature: 0, or 0/0 at eps = 0
        q[0, 0, 3:5] = -np.abs(q[0, 0, 3:5])
    w = rng.normal(size=(d, d)) if spec.info.needs_projection else None
    return validate(q, k, v, spec, w, _decay(kind, spec.decay, rng, q.shape))


def _no_smaller(fast: np.ndarray, ref: np.ndarray, rel: float) -> bool:
    """fast >= ref (1 - rel) element by element, infinite where ref is, NaN where ref is."""
    if not np.array_equal(np.isnan(fast), np.isnan(ref)):
        return False
    finite = np.isfinite(ref)
    with np.errstate(invalid="ignore"):
        return bool(
            np.all(fast[finite] >= ref[finite] * (1 - rel))
            and np.all(np.isinf(fast[np.isinf(ref)]))
        )


def _compare(x, spec: Spec, u: float, ref=None) -> tuple[float, float]:
    """Asserts the fast engine's (s, bound) against arb's: rigorous (s and the absolute
    bound u s no smaller) and tight (both within TIGHT); returns the range of the bound's
    ratio."""
    s_arb, b_arb = scale_and_bound(x, spec, ref, u, engine="arb")
    s_fast, b_fast = scale_and_bound(x, spec, ref, u, engine="fast")
    with np.errstate(invalid="ignore", divide="ignore"):
        abs_fast, abs_arb = b_fast * s_fast, b_arb * s_arb
        s_ratio, ratio = s_fast / s_arb, b_fast / b_arb
    case = f"{spec}, u = {u:g}"
    assert _no_smaller(s_fast, s_arb, ROUNDING), f"{case}: s below arb's, {np.nanmin(s_ratio)}"
    assert _no_smaller(abs_fast, abs_arb, ROUNDING), f"{case}: bound u s below arb's"
    assert _no_smaller(b_fast, b_arb, 1e-10), f"{case}: bound below, {np.nanmin(ratio)}"
    assert _no_smaller(s_arb * (1 + TIGHT), s_fast, 0.0), f"{case}: s {np.nanmax(s_ratio)}"
    assert _no_smaller(b_arb * (1 + TIGHT), b_fast, 0.0), f"{case}: bound {np.nanmax(ratio)}"
    ratio = ratio[np.isfinite(b_arb) & (b_arb > 0)]
    return float(ratio.min(initial=1.0)), float(ratio.max(initial=1.0))


@pytest.mark.parametrize(("name", "decay", "norm", "scale", "eps", "kind", "n"), CASES)
def test_the_fast_bound_is_the_arb_one_never_below(
    small_chunks, name, decay, norm, scale, eps, kind, n
):
    spec = Spec(name, causal=True, eps=eps, normalize=norm, scale=scale, decay=decay)
    x = _inputs(spec, kind, n, seed=n + len(name) + len(kind))
    # the long case in bfloat16, where (N + 1) u >= 1: the decays' error eta is infinite
    for dtype in ("float32", "bfloat16" if n >= 256 else "float16"):
        _compare(x, spec, UNIT_ROUNDOFF[dtype])


def test_the_fast_bound_with_the_exact_output_at_the_shipped_chunks():
    """CHUNK and SUB as shipped (N = 300 crosses two chunks), ref given (|out| in place of s)."""
    from linattn_verify.families import exact

    spec = Spec("elu", causal=True, eps=1e-6, scale=RSQRT_D, decay="channel-gates")
    x = _inputs(spec, "normal", 300, seed=5)
    low, high = _compare(x, spec, UNIT_ROUNDOFF["float32"], exact(x, spec))
    assert low > 1 - 1e-10 and high < 1 + 1e-10


def test_a_missing_decay_error_would_be_caught(small_chunks, monkeypatch):
    """The comparison can fail: without the decays' own error (A + F) eta, which dominates
    the bound of identity features (psi = 0) with gates in float32, the fast bound falls
    below arb's."""
    spec = Spec("identity", causal=True, normalize=False, decay="gates")
    x = _inputs(spec, "normal", 70, seed=1)
    u = UNIT_ROUNDOFF["float32"]
    s_arb, b_arb = scale_and_bound(x, spec, None, u, engine="arb")
    monkeypatch.setattr(decayed_bound, "_decay_errors", lambda head, spec, u: np.zeros(len(head.k)))
    s_fast, b_fast = scale_and_bound(x, spec, None, u, engine="fast")
    assert _no_smaller(s_fast, s_arb, ROUNDING)
    assert not _no_smaller(b_fast * s_fast, b_arb * s_arb, ROUNDING)
    assert np.nanmax(b_fast / b_arb) < 0.5  # the decay error: most of the bound


def _exact_sums(left, right, cols, decay: np.ndarray) -> np.ndarray:
    """sum_(j<=i) sum_m left_im right_jm w_ijm cols_j in arb at 256 bits (its midpoints):
    w = gamma^(i - j) for a 0-d decay, else exp(g_(j+1) + ... + g_i) per token (N,) or
    channel (N, m)."""
    with working_precision(256):
        return _exact_rows(left, right, cols, decay)


def _exact_rows(left, right, cols, decay: np.ndarray) -> np.ndarray:
    n, m = left.shape
    gates = decay.reshape(n, -1).tolist() if decay.ndim else None
    prefix = [[arb(0)] * (len(gates[0]) if gates else 1)]
    for row in gates or []:
        prefix.append([a + t for a, t in zip(prefix[-1], row, strict=True)])
    out = [[arb(0)] * cols.shape[1] for _ in range(n)]
    for i in range(n):
        for j in range(i + 1):
            for mm in range(m):
                if gates is None:
                    w = arb(float(decay)) ** (i - j)
                else:
                    ch = mm % len(prefix[0])
                    w = (prefix[i + 1][ch] - prefix[j + 1][ch]).exp()
                term = arb(left[i, mm]) * arb(right[j, mm]) * w
                out[i] = [a + term * t for a, t in zip(out[i], cols[j].tolist(), strict=True)]
    return np.array([[float(t.mid()) for t in row] for row in out])


@pytest.mark.parametrize("kind", ["constant", "gates", "strong", "weak", "channels"])
def test_one_sided_sums_bound_the_exact_decayed_sums_tightly(small_chunks, kind):
    """certified_decay.one_sided_sums: the upper bounds never below the exact sums, the
    lower ones never above, both within 1e-9 of them; exactly 0 where every term is."""
    rng = np.random.default_rng(len(kind))
    n, m = 45, 3
    left, right = rng.exponential(1.0, (2, n, m))
    left[5] = 0.0  # a row that meets nothing
    cols = np.concatenate([rng.exponential(1.0, (n, 1)), np.zeros((n, 1)), np.ones((n, 1))], 1)
    if kind == "constant":
        decay = np.float64(0.8)
    else:  # strong: factors of e^-50 and more a token, underflowing inside a chunk
        scale = {"strong": 50.0, "weak": 1e-6}.get(kind, 0.3)
        decay = -scale * rng.exponential(1.0, (n, m) if kind == "channels" else n)
    logs, gamma_e = decayed.log_decays(decay, n)
    want = _exact_sums(left, right, cols, np.asarray(decay))
    for upper in (True, False):
        blocks = decayed.one_sided_sums(
            lambda a, b: [left[a:b]], lambda a, b: [(right[a:b], cols[a:b])], logs, gamma_e, upper
        )
        got = np.concatenate([sums[0] for _, _, sums in blocks])
        high, low = (got, want) if upper else (want, got)
        assert np.all(high >= low), (upper, np.min(high / low))
        assert np.all(high <= low * (1 + 1e-9)), (upper, np.max(high / low))
        assert np.all(got[5] == 0) and np.all(got[:, 1] == 0)


def _exp_sums(x: np.ndarray, first: int, last: int) -> float:
    """exp(x_first + ... + x_last) (an empty sum: 1), correctly rounded but for ties."""
    with working_precision(256):
        return float(sum((arb(t) for t in x[first : last + 1].tolist()), arb(0)).exp().mid())


@pytest.mark.parametrize("upper", [True, False])
def test_every_one_sided_factor_is_on_its_side_of_the_exact_one(small_chunks, upper):
    """one_sided_factors: each factor (prefix, suffix, total of every chunk and sub-chunk,
    inside a sub-chunk) at least (upper) or at most exp of the exact sum of its log-decays,
    times 1 -+ LIB. Exponents of hundreds, whose computed sums err by 1e-13: unscaled, the
    factors fall on both sides."""
    rng = np.random.default_rng(4)
    n, channels = 2 * decayed.CHUNK, 2
    logs = -rng.uniform(20.0, 60.0, (n, channels))
    _, gamma_e = decayed.log_decays(logs, n)
    f = decayed.one_sided_factors(logs, gamma_e, upper)
    pairs = []  # (computed factor, exact)
    for c in range(n // decayed.CHUNK):
        for ch in range(channels):
            x = logs[c * decayed.CHUNK : (c + 1) * decayed.CHUNK, ch]
            pairs.append((f.tot[c, ch], _exp_sums(x, 0, len(x) - 1)))
            for t in range(len(x)):
                pairs += [(f.pre[c, t, ch], _exp_sums(x, 0, t))]
                pairs += [(f.suf[c, t, ch], _exp_sums(x, t + 1, len(x) - 1))]
            for s, sub in enumerate(x.reshape(-1, decayed.SUB)):
                pairs.append((f.tot2[c, s, ch], _exp_sums(sub, 0, len(sub) - 1)))
                for i in range(len(sub)):
                    pairs += [(f.pre2[c, s, i, ch], _exp_sums(sub, 0, i))]
                    pairs += [(f.suf2[c, s, i, ch], _exp_sums(sub, i + 1, len(sub) - 1))]
                    pairs += [
                        (f.diag[c, s, i, j, ch], _exp_sums(sub, j + 1, i)) for j in range(i + 1)
                    ]
    got, want = np.array(pairs).T
    slack = certified.LIB + certified.U64  # the exponential's and the exact's own rounding
    side = 1 - slack if upper else 1 + slack
    assert np.all(got >= want * side) if upper else np.all(got <= want * side)


def test_the_fast_engine_takes_scaled_specs_and_refuses_softmax():
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(3, 1, 1, 20, 4))
    spec = Spec("elu", causal=True, scale=RSQRT_D)
    s, b = scale_and_bound(validate(q, k, v, spec), spec, None, 2.0**-24, engine="fast")
    assert np.all(np.isfinite(s)) and np.all(np.isfinite(b))
    softmax = Spec("softmax", causal=True)
    with pytest.raises(SpecError, match="kernelised"):
        scale_and_bound(validate(q, k, v, softmax), softmax, None, 2.0**-24, engine="fast")


@pytest.mark.parametrize(
    ("spec", "fast"),
    [
        (Spec("identity", causal=True, normalize=False, decay="channel-gates"), True),
        (Spec("elu", causal=True, scale=RSQRT_D, decay="constant"), True),
        (Spec("softmax", causal=True), False),
    ],
)
def test_auto_takes_the_fast_engine_past_the_work_for_every_kernelised_spec(
    monkeypatch, spec, fast
):
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(3, 1, 1, 12, 4))
    x = validate(q, k, v, spec, None, _decay("normal", spec.decay, rng, q.shape))
    calls, original = [], bound._fast_sums
    monkeypatch.setattr(bound, "FAST_BOUND_WORK", 100)
    monkeypatch.setattr(bound, "_fast_sums", lambda *a: calls.append(a) or original(*a))
    scale_and_bound(x, spec, None, 2.0**-24)
    assert bool(calls) == fast


def test_the_denominator_condition_takes_the_decay_and_the_scale():
    """kappa_i = c sum_j w_ij |phi(q_i)|.|phi(k_j)| / |eps + c D_i| (signed features)."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, 50, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    g = -0.3 * torch.rand(1, 1, 50, generator=gen, dtype=torch.float64)
    spec = Spec("identity", causal=True, eps=0.5, scale=0.5, decay="gates")
    kappa = denominator_condition(validate(q, k, v, spec, None, g), spec)[0, 0, :, 0]
    prefix = torch.cumsum(g[0, 0], 0)
    w = torch.exp(prefix[:, None] - prefix[None, :]).tril()
    terms = (q[0, 0].abs() @ k[0, 0].abs().T) * w
    den = 0.5 + 0.5 * ((q[0, 0] @ k[0, 0].T) * w).sum(1)
    expected = (0.5 * terms.sum(1) / den.abs()).numpy()
    assert np.allclose(kappa, expected, rtol=1e-5)
