"""Decayed, scaled and unnormalised specs: the two exact engines against each other, closed
forms (numpy float64 and exact rationals, computed here), the exact state, bad inputs, the
built-in forms against the reference, and the a-priori bound of a float32 evaluation.

Definition (families/decayed/fields.py): out_i = c sum_(j<=i) w_ij sim(q_i, k_j) v_j, divided when
normalised by eps + c sum_(j<=i) w_ij sim(q_i, k_j); w_ij = gamma_h^(i - j) ("constant") or
exp(g_(j+1) + ... + g_i) ("gates"); c the scale (a number, or d^-0.5).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

import linattn_verify as lv
from linattn_verify.accuracy.bound import scale_and_bound
from linattn_verify.families import attention, attention_with_state, exact_state, validate
from linattn_verify.specs import RSQRT_D, Spec, SpecError

DECAYED_MAPS = [
    "elu",
    "relu",
    "identity",
    "performer-positive",
    "performer-hyperbolic",
    "performer-trig",
    "taylor",
]
B, H, N, D, DV = 2, 2, 7, 3, 2


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """One torch thread for this module: on two busy cores a 2x2 tril with two threads
    takes ~8 ms (thread wake-ups), which made the gradchecks take seconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- helpers


def _inputs(seed: int, n: int = N, d: int = D, b: int = B, positive: bool = False):
    """q, k, v (b, H, n, d/DV) float64; gamma (H,); g (b, H, n) in [-1.5, -0.05]."""
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, b, H, n, d))
    if positive:  # identity sims > 0: well-conditioned normalised denominators
        q, k = np.abs(q) + 0.1, np.abs(k) + 0.1
    v = rng.standard_normal((b, H, n, DV))
    gamma = np.array([0.875, 0.5])
    g = -rng.uniform(0.05, 1.5, (b, H, n))
    return q, k, v, gamma, g


def _decay_kwargs(decay: str | None, gamma, g) -> dict:
    return {"constant": {"gamma": gamma}, "gates": {"g": g}, None: {}}[decay]


def _proj(name: str, d: int, seed: int = 3):
    needs = lv.FEATURE_MAPS[name].needs_projection
    return lv.sample_projection(5, d, "iid", seed) if needs else None


def _assert_within_one_ulp(a: np.ndarray, b: np.ndarray) -> None:
    """Two faithful roundings of one real value differ by at most one float64 spacing."""
    assert a.shape == b.shape
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    ok = ~np.isnan(a)
    a, b = a[ok], b[ok]
    gap = np.spacing(np.maximum(np.abs(a), np.abs(b)))
    worst = np.max(np.abs(a - b) / gap, initial=0.0)
    assert np.all(np.abs(a - b) <= gap), f"engines differ by {worst} ulp"


def _np_features(x: np.ndarray, name: str) -> np.ndarray:
    if name == "elu":
        return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))
    if name == "relu":
        return np.maximum(x, 0.0)
    assert name == "identity"
    return x


def _np_weights(decay: str | None, gamma, g, b: int, h: int, n: int) -> np.ndarray:
    """w_ij straight from the definition: gamma^(i - j), or exp of the explicit sum
    g_(j+1) + ... + g_i (no prefix sums), 0 above the diagonal."""
    w = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1):
            if decay is None:
                w[i, j] = 1.0
            elif decay == "constant":
                w[i, j] = gamma[h] ** (i - j)
            else:
                w[i, j] = np.exp(np.sum(g[b, h, j + 1 : i + 1]))
    return w


def _np_attention(q, k, v, name, normalize, scale, decay, gamma, g, eps=0.0):
    """(out, magnitude) in numpy float64: the quadratic definition, and the scale
    sum_j c w_ij |sim_ij| |v_j| (/ |den_i| when normalised) errors are measured in."""
    b_, h_, n, d = q.shape
    c = d**-0.5 if scale == RSQRT_D else float(scale)
    out = np.empty((b_, h_, n, v.shape[3]))
    mag = np.empty_like(out)
    for b in range(b_):
        for h in range(h_):
            sims = _np_features(q[b, h], name) @ _np_features(k[b, h], name).T
            a = c * _np_weights(decay, gamma, g, b, h, n) * sims
            num, size = a @ v[b, h], np.abs(a) @ np.abs(v[b, h])
            if normalize:
                den = eps + a.sum(axis=1, keepdims=True)
                num, size = num / den, size / np.abs(den)
            out[b, h], mag[b, h] = num, size
    return out, mag


def _fraction_identity(q, k, v, scale, gamma) -> np.ndarray:
    """Unnormalised identity with a constant decay in exact rationals, correctly rounded
    (a rational scale only: 1, or d^-0.5 at d = 4)."""
    b_, h_, n, d = q.shape
    c = Fraction(1, 2) if scale == RSQRT_D else Fraction(scale)
    assert scale != RSQRT_D or d == 4
    out = np.empty((b_, h_, n, v.shape[3]))
    for b in range(b_):
        for h in range(h_):
            gm = Fraction(float(gamma[h]))
            qf = [[Fraction(t) for t in row] for row in q[b, h].tolist()]
            kf = [[Fraction(t) for t in row] for row in k[b, h].tolist()]
            vf = [[Fraction(t) for t in row] for row in v[b, h].tolist()]
            for i in range(n):
                for col in range(v.shape[3]):
                    total = Fraction(0)
                    for j in range(i + 1):
                        sim = sum(x * y for x, y in zip(qf[i], kf[j]))
                        total += c * gm ** (i - j) * sim * vf[j][col]
                    out[b, h, i, col] = float(total)
    return out


def _spec_error(call, *words: str) -> str:
    """The SpecError `call` raises: one line, naming each of `words`."""
    with pytest.raises(SpecError) as info:
        call()
    msg = str(info.value)
    assert "\n" not in msg, msg
    for word in words:
        assert word in msg, f"{word!r} not in {msg!r}"
    return msg


def _t(*arrays):
    return [torch.tensor(a, dtype=torch.float64) for a in arrays]


# --------------------------------------------------- 1. the engines agree within 1 ulp


def _engines_agree(name, decay, normalize, scale, eps=0.0, seed=0, g_scale=1.0, gamma=None):
    d = 4
    q, k, v, gm, g = _inputs(seed, n=9, d=d)
    gm = gm if gamma is None else gamma
    kw = dict(
        normalize=normalize, scale=scale, decay=decay, **_decay_kwargs(decay, gm, g * g_scale)
    )
    w = _proj(name, d)
    mp = lv.reference(q, k, v, name, True, w, eps, engine="mp", **kw)
    arb = lv.reference(q, k, v, name, True, w, eps, engine="arb", **kw)
    assert np.isfinite(mp).mean() > 0.5  # not a comparison of NaNs
    _assert_within_one_ulp(mp, arb)


@pytest.mark.parametrize("decay", ["constant", "gates"])
@pytest.mark.parametrize("name", DECAYED_MAPS)
def test_engines_agree_on_every_decayed_map(name, decay):
    _engines_agree(name, decay, normalize=True, scale=RSQRT_D, seed=1)


@pytest.mark.parametrize("scale", [1.0, RSQRT_D])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("decay", ["constant", "gates"])
@pytest.mark.parametrize("name", ["identity", "elu"])
def test_engines_agree_on_every_combination(name, decay, normalize, scale):
    _engines_agree(name, decay, normalize, scale, seed=2)


@pytest.mark.parametrize("name", ["taylor", "performer-trig"])
def test_engines_agree_unnormalised_with_a_number_scale(name):
    _engines_agree(name, "gates", normalize=False, scale=0.3, seed=4)


def test_engines_agree_with_eps_steep_gates_and_tiny_gamma():
    _engines_agree("elu", "gates", normalize=True, scale=2.5, eps=0.5, seed=5, g_scale=200.0)
    _engines_agree("identity", "constant", False, 1.0, seed=6, gamma=np.array([1e-300, 1.0]))


# ------------------------------------------------------------------- 2. closed forms


@pytest.mark.parametrize("name", ["identity", "elu", "performer-hyperbolic", "taylor"])
def test_gamma_one_and_zero_gates_give_the_plain_spec(name):
    q, k, v, _, _ = _inputs(7, positive=name == "identity")
    w = _proj(name, D)
    for normalize, scale in ((True, 1.0), (False, RSQRT_D)):
        plain = lv.reference(q, k, v, name, True, w, normalize=normalize, scale=scale)
        ones = lv.reference(
            q, k, v, name, True, w, normalize=normalize, scale=scale,
            decay="constant", gamma=np.ones(H),
        )  # fmt: skip
        zeros = lv.reference(
            q, k, v, name, True, w, normalize=normalize, scale=scale,
            decay="gates", g=np.zeros((B, H, N)),
        )  # fmt: skip
        _assert_within_one_ulp(ones, plain)
        _assert_within_one_ulp(zeros, plain)
    # and a real decay is not the plain spec
    decayed = lv.reference(q, k, v, name, True, w, decay="constant", gamma=np.full(H, 0.5))
    assert np.max(np.abs(decayed - lv.reference(q, k, v, name, True, w))) > 1e-3


@pytest.mark.parametrize("decay", ["constant", "gates"])
@pytest.mark.parametrize("name", ["identity", "elu", "performer-positive"])
def test_one_token(name, decay):
    q, k, v, gamma, g = _inputs(8, n=1, d=4)
    kw = _decay_kwargs(decay, gamma, g)
    w = _proj(name, 4)
    normalised = lv.reference(q, k, v, name, True, w, decay=decay, scale=RSQRT_D, **kw)
    np.testing.assert_array_equal(normalised, v)  # v itself, exactly (w_00 = 1, eps = 0)
    if name == "performer-positive":
        return
    out = lv.reference(q, k, v, name, True, normalize=False, scale=RSQRT_D, decay=decay, **kw)
    if name == "identity":  # c sim(q, k) v, c = 1/2 (d = 4), in exact rationals
        exact = np.empty_like(v)
        for b, h, col in np.ndindex(B, H, DV):
            sim = sum(Fraction(x) * Fraction(y) for x, y in zip(q[b, h, 0], k[b, h, 0]))
            exact[b, h, 0, col] = float(Fraction(1, 2) * sim * Fraction(v[b, h, 0, col]))
        _assert_within_one_ulp(out, exact)
    else:  # elu(x) + 1 features in numpy
        sim = np.sum(_np_features(q, name) * _np_features(k, name), axis=-1, keepdims=True)
        np.testing.assert_allclose(out, 0.5 * sim * v, rtol=1e-14, atol=0)


@pytest.mark.parametrize("scale", [1.0, RSQRT_D])
def test_identity_unnormalised_constant_decay_in_rationals(scale):
    q, k, v, gamma, _ = _inputs(9, n=6, d=4, b=1)
    gamma = np.array([0.75, 0.3])  # 0.3 is not dyadic: its float64 value is the gamma
    out = lv.reference(
        q, k, v, "identity", True, normalize=False, scale=scale, decay="constant", gamma=gamma
    )
    _assert_within_one_ulp(out, _fraction_identity(q, k, v, scale, gamma))


@pytest.mark.parametrize("scale", [1.0, 0.7, RSQRT_D])
@pytest.mark.parametrize("decay", ["constant", "gates"])
def test_identity_unnormalised_against_numpy(decay, scale):
    q, k, v, gamma, g = _inputs(10)
    out = lv.reference(
        q, k, v, "identity", True, normalize=False, scale=scale, decay=decay,
        **_decay_kwargs(decay, gamma, g),
    )  # fmt: skip
    want, mag = _np_attention(q, k, v, "identity", False, scale, decay, gamma, g)
    assert np.all(np.abs(out - want) <= 1e-13 * mag), np.max(np.abs(out - want) / mag)
    # relative to the value itself where the sum does not cancel much
    fine = np.abs(want) > 1e-2 * mag
    assert fine.mean() > 0.5
    np.testing.assert_allclose(out[fine], want[fine], rtol=1e-13, atol=0)


@pytest.mark.parametrize("name", ["elu", "relu"])
def test_normalised_gates_against_numpy(name):
    q, k, v, gamma, g = _inputs(11)
    q = q + 0.5  # relu: every row has a positive similarity
    k = np.abs(k)
    out = lv.reference(q, k, v, name, True, eps=0.25, scale=RSQRT_D, decay="gates", g=g)
    want, _ = _np_attention(q, k, v, name, True, RSQRT_D, "gates", gamma, g, eps=0.25)
    np.testing.assert_allclose(out, want, rtol=1e-13, atol=1e-15)


def test_the_first_gate_never_counts_and_gates_are_per_batch():
    q, k, v, _, g = _inputs(12)
    g2 = g.copy()
    g2[..., 0] = -40.0  # w_ij uses g_(j+1) .. g_i: g_0 enters no weight
    a = lv.reference(q, k, v, "identity", True, normalize=False, decay="gates", g=g)
    b = lv.reference(q, k, v, "identity", True, normalize=False, decay="gates", g=g2)
    np.testing.assert_array_equal(a, b)
    g3 = g.copy()
    g3[1] = g3[0]  # batch 1 with batch 0's gates: batch 0 unchanged, batch 1 not
    c = lv.reference(q, k, v, "identity", True, normalize=False, decay="gates", g=g3)
    np.testing.assert_array_equal(c[0], a[0])
    assert np.max(np.abs(c[1] - a[1])) > 1e-3


@pytest.mark.parametrize("decay", ["constant", "gates"])
def test_scale(decay):
    q, k, v, gamma, g = _inputs(13, positive=True)
    kw = dict(decay=decay, **_decay_kwargs(decay, gamma, g))
    un = {c: lv.reference(q, k, v, "identity", True, normalize=False, scale=c, **kw)
          for c in (1.0, 2.0, 0.3)}  # fmt: skip
    # a power of two scales exactly; 0.3 rounds once more
    _assert_within_one_ulp(un[2.0], 2 * un[1.0])
    np.testing.assert_allclose(un[0.3], 0.3 * un[1.0], rtol=8e-16, atol=0)
    assert np.max(np.abs(un[1.0])) > 0.1
    norm = {c: lv.reference(q, k, v, "elu", True, scale=c, **kw) for c in (1.0, 3.0, RSQRT_D)}
    _assert_within_one_ulp(norm[3.0], norm[1.0])
    _assert_within_one_ulp(norm[RSQRT_D], norm[1.0])
    # ... but not with eps > 0: eps does not scale
    with_eps = lv.reference(q, k, v, "elu", True, eps=1.0, scale=3.0, **kw)
    assert np.max(np.abs(with_eps - lv.reference(q, k, v, "elu", True, eps=1.0, **kw))) > 1e-6


# ------------------------------------------------------------------- 3. the exact state


@pytest.mark.parametrize("decay", ["constant", "gates"])
def test_exact_state_with_a_decay(decay):
    q, k, v, gamma, g = _inputs(14)
    values = gamma if decay == "constant" else g
    spec = Spec("identity", True, decay=decay)
    s, z = exact_state(validate(q, k, v, spec, None, values), spec)
    assert s.shape == (B, H, D, DV) and z.shape == (B, H, D)
    for b in range(B):
        for h in range(H):
            last = _np_weights(decay, gamma, g, b, h, N)[N - 1]  # w_(N-1, j)
            want_s = (k[b, h] * last[:, None]).T @ v[b, h]
            want_z = (k[b, h] * last[:, None]).sum(axis=0)
            mag = np.abs(k[b, h] * last[:, None]).T @ np.abs(v[b, h])
            assert np.all(np.abs(s[b, h] - want_s) <= 1e-13 * mag)
            np.testing.assert_allclose(z[b, h], want_z, rtol=0, atol=1e-13 * np.abs(k).sum())
    if decay == "constant":  # rational: exactly, within one ulp of the exact sums
        b, h = 1, 0
        gm = Fraction(float(gamma[h]))
        for f in range(D):
            for col in range(DV):
                total = sum(
                    gm ** (N - 1 - j) * Fraction(k[b, h, j, f]) * Fraction(v[b, h, j, col])
                    for j in range(N)
                )
                _assert_within_one_ulp(np.array([s[b, h, f, col]]), np.array([float(total)]))


def test_exact_state_with_gamma_one_is_the_undecayed_state():
    q, k, v, _, _ = _inputs(15)
    decayed = Spec("elu", True, decay="constant")
    plain = Spec("elu", True)
    s1, z1 = exact_state(validate(q, k, v, decayed, None, np.ones(H)), decayed)
    s0, z0 = exact_state(validate(q, k, v, plain), plain)
    _assert_within_one_ulp(s1, s0)
    _assert_within_one_ulp(z1, z0)
    # and gamma < 1 changes it
    s2, _ = exact_state(validate(q, k, v, decayed, None, np.full(H, 0.5)), decayed)
    assert np.max(np.abs(s2 - s0)) > 1e-3


# ---------------------------------------------------------------------- 4. bad input

_GAMMA_OK, _G_OK = np.array([0.9, 0.5]), -np.ones((B, H, N))
BAD = [  # (id, spec keywords, decay keywords, words the message must contain)
    ("gamma-0", {"decay": "constant"}, {"gamma": np.array([0.0, 0.5])}, ["gamma", "(0, 1]"]),
    ("gamma-1.5", {"decay": "constant"}, {"gamma": np.array([0.5, 1.5])}, ["gamma", "1.5"]),
    ("gamma-neg", {"decay": "constant"}, {"gamma": np.array([-0.5, 0.5])}, ["gamma", "-0.5"]),
    ("gamma-nan", {"decay": "constant"}, {"gamma": np.array([np.nan, 0.5])}, ["gamma", "nan"]),
    ("gamma-shape", {"decay": "constant"}, {"gamma": np.full(3, 0.5)}, ["gamma", "shape"]),
    ("gamma-BH", {"decay": "constant"}, {"gamma": np.full((B, H), 0.5)}, ["gamma", "shape"]),
    ("g-positive", {"decay": "gates"}, {"g": np.full((B, H, N), 0.1)}, ["g must be <= 0"]),
    ("g-nan", {"decay": "gates"}, {"g": np.full((B, H, N), np.nan)}, ["g has", "nan"]),
    ("g-inf", {"decay": "gates"}, {"g": np.full((B, H, N), np.inf)}, ["g has", "inf"]),
    ("g--inf", {"decay": "gates"}, {"g": np.full((B, H, N), -np.inf)}, ["g has", "-inf"]),
    ("g-shape-N", {"decay": "gates"}, {"g": -np.ones((B, H, N + 1))}, ["g must", "shape"]),
    ("g-shape-HN", {"decay": "gates"}, {"g": -np.ones((H, N))}, ["g must", "shape"]),
    ("missing-gamma", {"decay": "constant"}, {}, ["needs", "gamma"]),
    ("missing-g", {"decay": "gates"}, {}, ["needs", "g"]),
    ("g-for-constant", {"decay": "constant"}, {"gamma": _GAMMA_OK, "g": _G_OK}, ["g "]),
    ("gamma-for-gates", {"decay": "gates"}, {"gamma": _GAMMA_OK, "g": _G_OK}, ["gamma"]),
    ("g-without-decay", {}, {"g": _G_OK}, ["decay"]),
    ("non-causal", {"decay": "gates", "causal": False}, {"g": _G_OK}, ["causal"]),
    ("softmax", {"decay": "gates", "feature_map": "softmax"}, {"g": _G_OK}, ["softmax"]),
    ("cosformer", {"decay": "gates", "feature_map": "cosformer"}, {"g": _G_OK}, ["cosformer"]),
    ("unknown-decay", {"decay": "linear"}, {}, ["decay", "linear"]),
    ("unnormalised-eps", {"normalize": False, "eps": 0.1}, {}, ["unnormalised", "eps"]),
    ("scale-0", {"scale": 0.0}, {}, ["scale"]),
    ("scale-neg", {"scale": -1.0}, {}, ["scale"]),
    ("scale-inf", {"scale": np.inf}, {}, ["scale"]),
    ("scale-abc", {"scale": "abc"}, {}, ["scale", "abc"]),
]
# reference(decay=None, gamma=...) answers "give g only with its decay": it names g, the
# argument not given (reference/__init__.py picks the name by decay == 'gates' only).
GAMMA_WITHOUT_DECAY = (
    "gamma-without-decay",
    {},
    {"gamma": _GAMMA_OK},
    ["gamma"],
)


def _bad_params():
    params = [pytest.param(*case[1:], id=case[0]) for case in BAD]
    params.append(pytest.param(*GAMMA_WITHOUT_DECAY[1:], id=GAMMA_WITHOUT_DECAY[0]))
    return params


@pytest.mark.parametrize(("spec_kw", "decay_kw", "words"), _bad_params())
def test_bad_input_to_reference(spec_kw, decay_kw, words):
    q, k, v, _, _ = _inputs(16)
    kw = {"feature_map": "elu", "causal": True, **spec_kw}
    _spec_error(lambda: lv.reference(q, k, v, **kw, **decay_kw), *words)


@pytest.mark.parametrize(("spec_kw", "decay_kw", "words"), _bad_params())
def test_bad_input_to_the_built_in_forms(spec_kw, decay_kw, words):
    q, k, v = _t(*_inputs(16)[:3])
    kw = {"feature_map": "elu", "causal": True, "form": "chunked", "chunk_size": 4, **spec_kw}
    if not kw["causal"]:
        kw["form"] = "quadratic"
    dkw = {name: torch.tensor(val) for name, val in decay_kw.items()}
    _spec_error(lambda: attention(q, k, v, **kw, **dkw), *words)


@pytest.mark.parametrize("arg", ["gamma", "g"])
def test_attention_with_state_refuses_a_decay_for_a_plain_spec(arg):
    q, k, v = _t(*_inputs(16)[:3])
    value = torch.tensor(_GAMMA_OK if arg == "gamma" else _G_OK)
    _spec_error(lambda: attention_with_state(q, k, v, "elu", **{arg: value}), arg)


@pytest.mark.parametrize(
    "form",
    ["quadratic", "recurrent", "chunked"],
)  # fmt: skip
@pytest.mark.parametrize("spec_kw", [{"decay": "gates"}, {"normalize": False}])
def test_the_built_in_forms_refuse_a_non_finite_q(form, spec_kw):
    q, k, v, _, g = _inputs(16)
    q[0, 1, 2, 0] = np.nan
    tq, tk, tv, tg = _t(q, k, v, g)
    dk = {"g": tg} if spec_kw.get("decay") else {}
    call = lambda: attention(tq, tk, tv, "elu", True, form, chunk_size=4, **spec_kw, **dk)  # noqa: E731
    _spec_error(call, "q", "non-finite")


# -------------------------------------------------- 5. the built-in forms in float64

FORM_CASES = [  # (feature map, decay, normalize, scale)
    ("identity", "constant", False, 1.0),
    ("identity", "gates", False, RSQRT_D),
    ("identity", "gates", True, 0.6),
    ("identity", "constant", True, RSQRT_D),
    ("elu", "gates", True, 1.0),
    ("elu", "constant", False, RSQRT_D),
]


@pytest.mark.parametrize(("name", "decay", "normalize", "scale"), FORM_CASES)
def test_the_built_in_forms_against_the_reference(name, decay, normalize, scale):
    q, k, v, gamma, g = _inputs(17, n=9, positive=name == "identity" and normalize)
    kw = dict(normalize=normalize, scale=scale, decay=decay)
    ref = lv.reference(q, k, v, name, True, **kw, **_decay_kwargs(decay, gamma, g))
    _, mag = _np_attention(q, k, v, name, normalize, scale, decay, gamma, g)
    tq, tk, tv, tgamma, tg = _t(q, k, v, gamma, g)
    for form in ("quadratic", "recurrent", "chunked"):
        out = attention(
            tq, tk, tv, name, True, form, chunk_size=4, **kw, **_decay_kwargs(decay, tgamma, tg)
        )
        assert out.dtype == torch.float64 and out.shape == ref.shape
        err = np.abs(out.numpy() - ref)
        assert np.all(err <= 1e-12 * np.maximum(mag, np.abs(ref))), (form, np.max(err / mag))


@pytest.mark.parametrize(("name", "decay", "normalize", "scale"), FORM_CASES[1:5])
def test_attention_with_state_split_at_a_ragged_point(name, decay, normalize, scale):
    q, k, v, gamma, g = _inputs(18, n=11, positive=name == "identity" and normalize)
    tq, tk, tv, tgamma, tg = _t(q, k, v, gamma, g)
    kw = dict(normalize=normalize, scale=scale, decay=decay, chunk_size=4)

    def run(lo, hi, state=None):
        dk = {"constant": {"gamma": tgamma}, "gates": {"g": tg[..., lo:hi]}}[decay]
        parts = (t[..., lo:hi, :] for t in (tq, tk, tv))
        return attention_with_state(*parts, name, initial_state=state, **kw, **dk)

    whole, final = run(0, 11)
    first, state = run(0, 3)
    second, state = run(3, 11, state)
    _, mag = _np_attention(q, k, v, name, normalize, scale, decay, gamma, g)
    err = np.abs(torch.cat([first, second], dim=-2).numpy() - whole.numpy())
    assert np.all(err <= 1e-13 * mag)
    if normalize:
        (s_whole, z_whole), (s_split, z_split) = final, state
        np.testing.assert_allclose(z_split, z_whole, rtol=1e-13, atol=1e-14)
    else:
        assert isinstance(final, torch.Tensor) and isinstance(state, torch.Tensor)
        s_whole, s_split = final, state
    np.testing.assert_allclose(s_split, s_whole, rtol=1e-12, atol=1e-13)
    # the final state is the exact state of the whole sequence
    spec = Spec(name, True, normalize=normalize, scale=scale, decay=decay)
    s_exact, z_exact = exact_state(
        validate(q, k, v, spec, None, gamma if decay == "constant" else g), spec
    )
    np.testing.assert_allclose(s_whole, s_exact, rtol=1e-12, atol=1e-13)
    if normalize:
        np.testing.assert_allclose(z_whole, z_exact, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("normalize", [True, False])
def test_gradients_flow_through_the_chunked_gated_form(normalize):
    rng = np.random.default_rng(19)
    q, k = torch.tensor(rng.standard_normal((2, 1, 1, 5, 2)))
    v = torch.tensor(rng.standard_normal((1, 1, 5, 2)))
    g = torch.tensor(-rng.uniform(0.2, 1.0, (1, 1, 5)))
    args = [t.clone().requires_grad_() for t in (q, k, v, g)]

    def fn(q, k, v, g):
        return attention(
            q, k, v, "elu", True, "chunked", chunk_size=2, normalize=normalize,
            scale=RSQRT_D, decay="gates", g=g,
        )  # fmt: skip

    assert torch.autograd.gradcheck(fn, args, eps=1e-6, atol=1e-8, rtol=1e-6)
    fn(*args).sum().backward()
    grad_g = args[3].grad
    assert grad_g is not None and torch.all(grad_g[..., 1:].abs() > 1e-6)
    # g_0 enters no weight: its gradient is 0 but for the rounding of the prefix sums
    assert torch.all(grad_g[..., 0].abs() <= 1e-12 * grad_g.abs().max())


# ------------------------------------------------------- 6. the a-priori bound, float32

BOUND_CASES = [  # (feature map, decay, normalize, scale, n)
    ("elu", "gates", True, RSQRT_D, 9),
    ("elu", "constant", True, 1.0, 9),
    ("identity", "constant", False, 1.0, 9),
    ("identity", "gates", False, RSQRT_D, 9),
]


@pytest.mark.parametrize(("name", "decay", "normalize", "scale", "n"), BOUND_CASES)
def test_a_float32_chunked_evaluation_is_within_the_bound(name, decay, normalize, scale, n):
    q, k, v, gamma, g = _inputs(20, n=n)
    tq, tk, tv, tgamma, tg = (torch.tensor(a, dtype=torch.float32) for a in (q, k, v, gamma, g))
    values = tgamma if decay == "constant" else tg
    kw = dict(normalize=normalize, scale=scale, decay=decay)
    dk = {("gamma" if decay == "constant" else "g"): values}
    out = attention(tq, tk, tv, name, True, "chunked", chunk_size=4, **kw, **dk)
    assert out.dtype == torch.float32
    spec = Spec(name, True, normalize=normalize, scale=scale, decay=decay)
    ref = lv.reference(tq, tk, tv, name, True, **kw, **dk)  # exact, of the float32 inputs
    x = validate(tq, tk, tv, spec, None, values)
    u = 2.0**-24
    s, bound = scale_and_bound(x, spec, ref, u)
    assert np.all(np.isfinite(bound)) and np.all(s > 0)
    err = np.abs(out.double().numpy() - ref) / (u * s)
    assert np.all(err <= bound), np.max(err / bound)
    assert np.max(err) > 0  # float32 arithmetic did round somewhere
    assert np.max(bound) < 2e3  # and the bound is not vacuous
