"""The delta rule's exact gradients (families/delta/gradients.py): mpmath and arb agree bit for
bit on every variant; central finite differences of a 400-bit forward written here (checked
against mp_delta) and torch float64 autograd of a recurrence written here confirm the
formulas; exact rational gradients computed here confirm the rounding, also where precision
control must notice amplified cancellation; structural zeros stay exact; bad input.

Definition (families/delta/fields.py): y_t = D_t S_(t-1); u_t = v_t - y_t^T k_t; S_t = y_t + beta_t
k_t u_t^T; o_t = c S_t^T q_t; L = sum(o * G) + sum(S_N * G_S).
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch

from linattn_verify.accuracy.gradient import gradient_names
from linattn_verify.families import validate
from linattn_verify.families.delta.fields import QK_L2NORM_EPS
from linattn_verify.families.delta.gradients import (
    arb_delta_gradients,
    exact_delta_gradients,
    mp_delta_gradients,
)
from linattn_verify.families.delta.inputs import pack_delta
from linattn_verify.families.delta.reference import mp_delta
from linattn_verify.reference.common import ReferenceAccuracyError
from linattn_verify.specs import RSQRT_D, Spec, SpecError

DECAYS = [None, "gates", "channel-gates"]
KINDS = ["beta-near-2", "parallel-keys", "keys-of-norm-3", "underflow"]
ENGINES = [mp_delta_gradients, arb_delta_gradients]
# (initial_state given, G_S given)
STATES = [(False, False), (True, False), (False, True), (True, True)]


def _spec(decay: str | None, l2: bool, scale: float | str = RSQRT_D) -> Spec:
    return Spec(
        "identity", True, normalize=False, scale=scale, decay=decay, delta_rule=True, qk_l2norm=l2
    )


def typical_draws(rng, decay, l2: bool, sizes: tuple[int, ...]):
    """q, k, v, beta, g, S_0 ~ N(0, 1) of sizes (B, H, N, d, dv): unit keys unless l2
    (normalised inside), beta in (0, 1), gates in [-1, -0.05]."""
    b, h, n, d, dv = sizes
    q, k = rng.normal(size=(2, b, h, n, d))
    v = rng.normal(size=(b, h, n, dv))
    beta = rng.uniform(0, 1, (b, h, n))
    g = -rng.uniform(0.05, 1, (b, h, n) if decay == "gates" else (b, h, n, d))
    state = rng.normal(size=(b, h, d, dv))
    if not l2:
        k /= np.linalg.norm(k, axis=-1, keepdims=True)
    return q, k, v, beta, g, state


def _case(decay, l2, seed, kind="typical", s0=True, gs=True, n=5, d=3, dv=2, b=1, h=2):
    """(x, spec, G, G_S or None, S_0 or None): typical inputs (unit keys unless normalised
    inside, beta in (0, 1), gates in [-1, -0.05]), or one of KINDS as in
    test_delta_reference: beta within 1e-3 of 2; nearly parallel keys with beta = 1 and
    nearly equal values; keys of norm 3 and beta up to 2 (the state grows); values and S_0
    near 2^-1000 and gates down to -800."""
    rng = np.random.default_rng(seed)
    q, k, v, beta, g, state = typical_draws(rng, decay, l2, (b, h, n, d, dv))
    if kind == "beta-near-2":
        beta = 2 - rng.uniform(0, 1e-3, beta.shape)
    elif kind == "parallel-keys":
        k = k[:, :, :1] + 1e-7 * k
        v = v[:, :, :1] + 1e-9 * v
        beta[:] = 1.0
    elif kind == "keys-of-norm-3":
        k *= 3 / np.linalg.norm(k, axis=-1, keepdims=True)
        beta = 2 * beta
    elif kind == "underflow":
        v, state = 2.0**-1000 * v, 2.0**-1000 * state
        g = 800 * g
    spec = _spec(decay, l2)
    packed = pack_delta(torch.tensor(beta), None if decay is None else torch.tensor(g))
    x = validate(q, k, v, spec, None, packed)
    g_out = rng.normal(size=v.shape)
    g_state = rng.normal(size=state.shape) if gs else None
    return x, spec, g_out, g_state, state if s0 else None


def _expected_names(spec: Spec, s0, gs) -> set[str]:
    return set(gradient_names(spec)) | ({"S0"} if s0 is not None or gs is not None else set())


# --------------------------------------------------------------------- mpmath == arb


VARIANTS = [(decay, l2, st) for decay in DECAYS for l2 in (False, True) for st in STATES]


@pytest.mark.parametrize(("decay", "l2", "states"), VARIANTS)
def test_mpmath_and_arb_agree_bit_for_bit(decay, l2, states):
    x, spec, g_out, g_state, s0 = _case(decay, l2, 10 + VARIANTS.index((decay, l2, states)),
                                        s0=states[0], gs=states[1])  # fmt: skip
    got_mp = mp_delta_gradients(x, spec, g_out, g_state, s0)
    got_arb = arb_delta_gradients(x, spec, g_out, g_state, s0)
    assert set(got_mp) == set(got_arb) == _expected_names(spec, s0, g_state)
    for name, want in got_arb.items():
        assert np.all(np.isfinite(want)), name
        assert np.array_equal(got_mp[name], want), (name, np.max(np.abs(got_mp[name] - want)))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("l2", [False, True])
def test_mpmath_and_arb_agree_on_hard_inputs(kind, decay, l2):
    x, spec, g_out, g_state, s0 = _case(decay, l2, len(kind) + 3 * l2, kind)
    got_mp = mp_delta_gradients(x, spec, g_out, g_state, s0)
    got_arb = arb_delta_gradients(x, spec, g_out, g_state, s0)
    for name, want in got_arb.items():
        assert np.array_equal(got_mp[name], want), (name, np.max(np.abs(got_mp[name] - want)))


# ------------------------------------------------- central differences of the forward

FD_PREC = 400
FD_STEP = mpmath.mpf(2) ** -100  # truncation ~ 2^-200, cancellation ~ 2^-300: far below 2^-53


def _mp_loss(x, spec, g_out, g_state, s0, b: int, h: int, bump: tuple | None = None):
    """The loss of head (b, h) at the working precision, inputs as given but for
    bump = (name, index, delta): that input element plus delta; also (o, S_N) as mpf."""
    mp = mpmath.mp
    d, dv = x.q.shape[3], x.v.shape[3]
    arrays = {"q": x.q[b, h], "k": x.k[b, h], "v": x.v[b, h], "beta": x.beta[b, h]}
    if x.decay is not None:
        arrays["g"] = x.decay[b, h]
    arrays["S0"] = np.zeros((d, dv)) if s0 is None else s0[b, h]
    vals = {name: np.vectorize(mp.mpf, otypes=[object])(a) for name, a in arrays.items()}
    if bump is not None:
        name, index, delta = bump
        vals[name][index] += delta
    c = 1 / mp.sqrt(d) if spec.scale == RSQRT_D else mp.mpf(spec.scale)
    state = vals["S0"].copy()
    loss, outs = mp.zero, []
    for t in range(x.q.shape[2]):
        q, k = vals["q"][t], vals["k"][t]
        if spec.qk_l2norm:
            q = q / mp.sqrt(sum(q * q) + mp.mpf(QK_L2NORM_EPS))
            k = k / mp.sqrt(sum(k * k) + mp.mpf(QK_L2NORM_EPS))
        if spec.decay == "gates":
            state = state * mp.exp(vals["g"][t])
        elif spec.decay == "channel-gates":
            state = state * np.array([mp.exp(a) for a in vals["g"][t]], dtype=object)[:, None]
        u = vals["v"][t] - k @ state
        state = state + vals["beta"][t] * np.outer(k, u)
        o = c * (q @ state)
        outs.append(o)
        loss += sum(o * g_out[b, h, t])
    if g_state is not None:
        loss += sum((state * g_state[b, h]).ravel())
    return loss, outs, state


@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("l2", [False, True])
def test_central_differences_of_the_forward(decay, l2):
    """A few elements of every gradient (S0 included) against (L(a + h) - L(a - h)) / 2h at
    400 bits, within one ulp of the reference; the forward written here is mp_delta's (its
    outputs and final state within one ulp)."""
    x, spec, g_out, g_state, s0 = _case(decay, l2, 40 + 2 * DECAYS.index(decay) + l2, b=2, h=1)
    got = mp_delta_gradients(x, spec, g_out, g_state, s0)
    out, final = mp_delta(x, spec, s0, state=True)
    rng = np.random.default_rng(5)
    with mpmath.workprec(FD_PREC):
        for b in range(2):
            _, outs, state = _mp_loss(x, spec, g_out, g_state, s0, b, 0)
            mine = np.array([[float(a) for a in o] for o in outs])
            assert np.all(np.abs(mine - out[b, 0]) <= np.spacing(np.abs(out[b, 0])))
            mine = np.array([[float(a) for a in r] for r in state])
            assert np.all(np.abs(mine - final[b, 0]) <= np.spacing(np.abs(final[b, 0])))
        for name, grad in got.items():
            for _ in range(3):
                b, *index = (int(rng.integers(n)) for n in grad.shape[:1] + grad.shape[2:])
                index = tuple(index)
                plus = _mp_loss(x, spec, g_out, g_state, s0, b, 0, (name, index, FD_STEP))[0]
                minus = _mp_loss(x, spec, g_out, g_state, s0, b, 0, (name, index, -FD_STEP))[0]
                fd = float((plus - minus) / (2 * FD_STEP))
                ref = grad[(b, 0, *index)]
                assert abs(ref - fd) <= np.spacing(abs(fd)), (name, b, index, ref, fd)


# ------------------------------------------------------------------ torch autograd


def _torch_gradients(x, spec, g_out, g_state, s0) -> dict[str, np.ndarray]:
    """Autograd of the recurrence in torch float64, all heads at once."""
    leaf = {"q": x.q, "k": x.k, "v": x.v, "beta": x.beta}
    if x.decay is not None:
        leaf["g"] = x.decay
    if s0 is not None:
        leaf["S0"] = s0
    t = {name: torch.tensor(a, requires_grad=True) for name, a in leaf.items()}
    q, k = t["q"], t["k"]
    if spec.qk_l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + QK_L2NORM_EPS)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + QK_L2NORM_EPS)
    b_, h_, n, d = x.q.shape
    state = t["S0"] if s0 is not None else torch.zeros(b_, h_, d, x.v.shape[3], dtype=torch.float64)
    outs = []
    for i in range(n):
        if spec.decay == "gates":
            state = state * torch.exp(t["g"][:, :, i])[..., None, None]
        elif spec.decay == "channel-gates":
            state = state * torch.exp(t["g"][:, :, i])[..., None]
        u = t["v"][:, :, i] - torch.einsum("bhm,bhmc->bhc", k[:, :, i], state)
        state = state + t["beta"][:, :, i, None, None] * k[:, :, i, :, None] * u[..., None, :]
        outs.append(spec.scale_for(d) * torch.einsum("bhm,bhmc->bhc", q[:, :, i], state))
    loss = (torch.stack(outs, 2) * torch.tensor(g_out)).sum()
    if g_state is not None:
        loss = loss + (state * torch.tensor(g_state)).sum()
    loss.backward()
    return {name: a.grad.numpy() for name, a in t.items()}


@pytest.mark.parametrize(("decay", "l2", "states"), VARIANTS)
def test_against_torch_autograd(decay, l2, states):
    """Every gradient within 3e-13 of the largest of its elements (torch's rounding)."""
    x, spec, g_out, g_state, s0 = _case(decay, l2, 70 + VARIANTS.index((decay, l2, states)),
                                        s0=states[0], gs=states[1], n=7, b=2)  # fmt: skip
    got = exact_delta_gradients(x, spec, g_out, g_state, s0)
    names = _expected_names(spec, s0, g_state)
    if s0 is None and g_state is not None:  # dS_0 is that of an explicit zero state
        s0 = np.zeros((*x.q.shape[:2], x.q.shape[3], x.v.shape[3]))
    want = _torch_gradients(x, spec, g_out, g_state, s0)
    assert set(got) == set(want) == names
    for name, w in want.items():
        top = np.max(np.abs(w))
        assert top > 0, name
        assert np.max(np.abs(got[name] - w)) <= 3e-13 * top, (name, np.max(np.abs(got[name] - w)))


# ---------------------------------------------------- exact rationals: the rounding


def _fraction_gradients(x, scale, g_out, g_state=None, s0=None) -> dict[str, np.ndarray]:
    """The gradients of an undecayed spec with a rational scale and no qk_l2norm in exact
    rationals (the reverse-mode formulas, written here from the definition), each rounded
    to the nearest float64 (float(Fraction))."""
    b_, h_, n, d = x.q.shape
    dv = x.v.shape[3]
    shapes = {"q": (n, d), "k": (n, d), "v": (n, dv), "beta": (n,), "S0": (d, dv)}
    out = {name: np.empty((b_, h_, *shape)) for name, shape in shapes.items()}
    c = Fraction(scale)

    def exact(a):
        return [[Fraction(t) for t in row] for row in a.tolist()]

    for b in range(b_):
        for h in range(h_):
            q, k, v, go = (exact(a[b, h]) for a in (x.q, x.k, x.v, g_out))
            beta = [Fraction(t) for t in x.beta[b, h].tolist()]
            state = [[Fraction(0)] * dv for _ in range(d)] if s0 is None else exact(s0[b, h])
            ys, us, states = [], [], []
            for t in range(n):
                y = state
                u = [v[t][j] - sum(y[m][j] * k[t][m] for m in range(d)) for j in range(dv)]
                state = [[y[m][j] + beta[t] * k[t][m] * u[j] for j in range(dv)] for m in range(d)]
                ys.append(y)
                us.append(u)
                states.append(state)
            lam = (
                [[Fraction(0)] * dv for _ in range(d)] if g_state is None else exact(g_state[b, h])
            )
            for t in reversed(range(n)):
                lam = [[lam[m][j] + c * q[t][m] * go[t][j] for j in range(dv)] for m in range(d)]
                kl = [sum(k[t][m] * lam[m][j] for m in range(d)) for j in range(dv)]
                out["v"][b, h, t] = [float(beta[t] * a) for a in kl]
                out["beta"][b, h, t] = float(sum(a * w for a, w in zip(kl, us[t])))
                out["k"][b, h, t] = [
                    float(beta[t] * sum(lam[m][j] * us[t][j] - ys[t][m][j] * kl[j]
                                        for j in range(dv)))
                    for m in range(d)
                ]  # fmt: skip
                out["q"][b, h, t] = [
                    float(c * sum(states[t][m][j] * go[t][j] for j in range(dv))) for m in range(d)
                ]
                lam = [[lam[m][j] - beta[t] * k[t][m] * kl[j] for j in range(dv)] for m in range(d)]
            out["S0"][b, h] = [[float(a) for a in row] for row in lam]
    return out


def _rational_case(seed: int):
    """Random inputs of an undecayed spec with scale 1/2 (all gradients rational)."""
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(2, 2, 2, 6, 3))
    v = rng.normal(size=(2, 2, 6, 2))
    beta = rng.uniform(0, 2, (2, 2, 6))
    spec = _spec(None, False, scale=0.5)
    x = validate(q, k, v, spec, None, pack_delta(torch.tensor(beta)))
    return (
        x,
        spec,
        rng.normal(size=v.shape),
        rng.normal(size=(2, 2, 3, 2)),
        rng.normal(size=(2, 2, 3, 2)),
    )


@pytest.mark.parametrize("engine", [*ENGINES, exact_delta_gradients])
def test_rational_cases_are_the_nearest_float64(engine):
    x, spec, g_out, g_state, s0 = _rational_case(3)
    want = _fraction_gradients(x, 0.5, g_out, g_state, s0)
    got = engine(x, spec, g_out, g_state, s0)
    for name, w in want.items():
        assert np.array_equal(got[name], w), (name, np.max(np.abs(got[name] - w)))


def _amplifying(n: int = 60):
    """d = dv = 1, k_t near 3, beta_t near 2 (full mantissas), v_t chosen so that S_t stays
    near r_t in [-1, 1] (as test_delta_reference._amplifying): each step amplifies earlier
    errors 17 times (17^60 ~ 2^245), and y_t enters dk_t and u_t enters dbeta_t."""
    rng = np.random.default_rng(23)
    k = 3 + rng.uniform(0, 1e-3, n)
    beta = 2 - rng.uniform(0, 1e-3, n)
    s, vs = Fraction(0), []
    for r, kt, bt in zip(rng.uniform(-1, 1, n).tolist(), k.tolist(), beta.tolist()):
        a, injected = 1 - Fraction(bt) * Fraction(kt) ** 2, Fraction(bt) * Fraction(kt)
        vs.append(float((Fraction(r) - a * s) / injected))
        s = a * s + injected * Fraction(vs[-1])
    v = np.array(vs).reshape(1, 1, n, 1)
    spec = _spec(None, False, scale=1.0)
    x = validate(rng.normal(size=v.shape), k.reshape(v.shape), v, spec, None,
                 pack_delta(torch.tensor(beta.reshape(1, 1, n))))  # fmt: skip
    return x, spec, rng.uniform(-1, 1, v.shape)


@pytest.mark.parametrize("engine", ENGINES)
def test_precision_control_notices_amplified_cancellation(engine):
    """At 256 bits some of dq, dk are not resolved (the engine raises rather than return
    them); by default every gradient is the nearest float64 of the exact one."""
    x, spec, g_out = _amplifying()
    with pytest.raises(ReferenceAccuracyError, match="not resolved"):
        engine(x, spec, g_out, max_prec=256)
    want = _fraction_gradients(x, 1.0, g_out)
    got = engine(x, spec, g_out)
    for name in ("q", "k", "v", "beta"):
        assert np.array_equal(got[name], want[name]), name


def _amplifying_adjoint(n: int = 60):
    """The same transitions backwards: d = dv = 1, q = 1, c = 1, Lam_(t-1) = a_t Lam_t +
    G_(t-1) with a_t = 1 - beta_t k_t^2 near -17, G_(t-1) the float64 nearest r - a_t
    Lam_t, r in [-1, 1]: Lam_t stays near r while earlier (later in t) errors grow 17 times
    a step; dv_t = beta_t k_t Lam_t and dbeta_t = k_t Lam_t u_t need them all."""
    rng = np.random.default_rng(29)
    k = 3 + rng.uniform(0, 1e-3, n)
    beta = 2 - rng.uniform(0, 1e-3, n)
    g_out = np.empty(n)
    g_out[-1] = rng.uniform(-1, 1)
    lam = Fraction(g_out[-1])
    for t in range(n - 1, 0, -1):
        a = 1 - Fraction(beta[t]) * Fraction(k[t]) ** 2
        g_out[t - 1] = float(Fraction(rng.uniform(-1, 1)) - a * lam)
        lam = a * lam + Fraction(g_out[t - 1])
    shape = (1, 1, n, 1)
    spec = _spec(None, False, scale=1.0)
    x = validate(np.ones(shape), k.reshape(shape), rng.uniform(-1, 1, shape), spec, None,
                 pack_delta(torch.tensor(beta.reshape(1, 1, n))))  # fmt: skip
    return x, spec, g_out.reshape(shape)


@pytest.mark.parametrize("engine", ENGINES)
def test_precision_control_notices_amplified_cancellation_in_the_adjoint(engine):
    """At 256 bits some of dv, dbeta are not resolved; by default every gradient is the
    nearest float64 of the exact one."""
    x, spec, g_out = _amplifying_adjoint()
    with pytest.raises(ReferenceAccuracyError, match="not resolved"):
        engine(x, spec, g_out, max_prec=256)
    want = _fraction_gradients(x, 1.0, g_out)
    got = engine(x, spec, g_out)
    for name in ("q", "k", "v", "beta"):
        assert np.array_equal(got[name], want[name]), name


@pytest.mark.parametrize("engine", ENGINES)
def test_a_value_absorbed_at_226_bits_is_recovered(engine):
    """d = dv = 1, k = q = G = 1, beta = 1/2, v = 2^301, 1, -2^299: S = 2^300, 2^299 + 1/2,
    1/4, so dq_3 = S_3 = 1/4, which 113 and 226 bits alike round to 0."""
    v = np.array([2.0**301, 1.0, -(2.0**299)]).reshape(1, 1, 3, 1)
    spec = _spec(None, False, scale=1.0)
    x = validate(np.ones_like(v), np.ones_like(v), v, spec, None,
                 pack_delta(torch.full((1, 1, 3), 0.5, dtype=torch.float64)))  # fmt: skip
    got = engine(x, spec, np.ones_like(v))
    assert got["q"].ravel()[2] == 0.25
    want = _fraction_gradients(x, 1.0, np.ones_like(v))
    for name in ("q", "k", "v", "beta"):
        assert np.array_equal(got[name], want[name]), name


# ------------------------------------------------------------------------ properties


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("decay", DECAYS)
def test_dq_is_zero_where_the_cotangent_is(engine, decay):
    x, spec, g_out, g_state, s0 = _case(decay, True, 90, n=6)
    g_out[:, :, [1, 4]] = 0.0
    got = engine(x, spec, g_out, g_state, s0)
    assert np.all(got["q"][:, :, [1, 4]] == 0.0)
    assert np.all(got["q"][:, :, [0, 2, 3, 5]] != 0.0)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("l2", [False, True])
def test_a_token_with_beta_zero_has_no_dv_or_dk(engine, l2):
    """beta_t = 0: S_t = y_t whatever v_t and k_t (dbeta_t is not 0)."""
    x, spec, g_out, g_state, s0 = _case("channel-gates", l2, 95)
    beta = x.beta.copy()
    beta[:, :, 2] = 0.0
    got = engine(dataclasses.replace(x, beta=beta), spec, g_out, g_state, s0)
    assert np.all(got["v"][:, :, 2] == 0.0) and np.all(got["k"][:, :, 2] == 0.0)
    assert np.all(got["beta"] != 0.0) and np.all(got["v"][:, :, [0, 1, 3, 4]] != 0.0)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("l2", [False, True])
def test_zero_cotangents_give_zero_gradients(engine, decay, l2):
    x, spec, g_out, g_state, s0 = _case(decay, l2, 91)
    got = engine(x, spec, np.zeros_like(g_out), np.zeros_like(g_state), s0)
    assert set(got) == _expected_names(spec, s0, g_state)
    for name, grad in got.items():
        assert np.all(grad == 0.0), name


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("decay", ["gates", "channel-gates"])
def test_the_first_gate_is_inert_without_an_initial_state(engine, decay):
    """With S_0 = 0, y_1 = 0: dL/dg at token 0 is exactly 0, the others are not."""
    x, spec, g_out, g_state, _ = _case(decay, False, 92)
    got = engine(x, spec, g_out, g_state)
    assert np.all(got["g"][:, :, 0] == 0.0) and np.all(got["g"][:, :, 1:] != 0.0)


def test_names_and_the_initial_state_key():
    x, spec, g_out, g_state, s0 = _case("gates", False, 93)
    assert gradient_names(spec) == ("q", "k", "v", "beta", "g")
    assert gradient_names(_spec(None, True)) == ("q", "k", "v", "beta")
    assert "S0" not in exact_delta_gradients(x, spec, g_out)
    assert exact_delta_gradients(x, spec, g_out, initial_state=s0)["S0"].shape == s0.shape
    assert exact_delta_gradients(x, spec, g_out, g_state)["S0"].shape == g_state.shape


@pytest.mark.parametrize("engine", [*ENGINES, exact_delta_gradients])
def test_bad_arguments_are_one_line_spec_errors(engine):
    x, spec, g_out, g_state, s0 = _case("channel-gates", False, 94)
    plain = Spec("identity", True, normalize=False)
    bad = [
        ((x, plain, g_out), "delta-rule"),
        ((dataclasses.replace(x, beta=None), spec, g_out), "beta"),
        ((dataclasses.replace(x, decay=x.decay[..., 0]), spec, g_out), "log-gates"),
        ((x, spec, None), "g_out is missing"),
        ((x, spec, g_out[:, :, :-1]), "g_out must have shape"),
        ((x, spec, g_out, g_state[..., :1]), "g_state must have shape"),
        ((x, spec, g_out, None, s0[:, :1]), "initial_state must have shape"),
    ]
    for args, match in bad:
        with pytest.raises(SpecError, match=match) as info:
            engine(*args)
        assert "\n" not in str(info.value)
