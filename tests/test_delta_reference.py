"""The delta rule's references (families/delta/reference.py): mpmath and arb agree bit for
bit on every variant; closed forms computed here; precision control notices growth and
cancellation; the float64 engine's bound holds against arb (its values, an independent
recurrence written here,
its final state); it certifies typical long inputs without arb; the wiring (reference, exact,
exact_state).

Definition (families/delta/fields.py): S <- D_t S; u_t = beta_t (v_t - S^T k_t); S <- S + k_t u_t^T;
o_t = c S^T q_t; D_t = exp(g_t) (gates), diag(exp(g_t)) (channel gates) or I.
"""

from __future__ import annotations

from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch
from flint import arb, arb_mat

from linattn_verify.families import exact, exact_state, reference, validate
from linattn_verify.families.delta import reference as engine
from linattn_verify.families.delta.fields import QK_L2NORM_EPS
from linattn_verify.families.delta.inputs import pack_delta
from linattn_verify.families.delta.reference import (
    arb_delta,
    certified_delta,
    delta_scale,
    exact_delta_state,
    float64_delta,
    mp_delta,
)
from linattn_verify.reference import ReferenceAccuracyError
from linattn_verify.reference.balls import balls, working_precision
from linattn_verify.specs import RSQRT_D, Spec, SpecError

DECAYS = [None, "gates", "channel-gates"]
KINDS = ["typical", "beta-near-2", "parallel-keys", "keys-of-norm-3", "underflow"]


def _spec(decay: str | None, l2: bool, scale: float | str = RSQRT_D) -> Spec:
    return Spec(
        "identity", True, normalize=False, scale=scale, decay=decay, delta_rule=True, qk_l2norm=l2
    )


def _case(kind: str, decay, l2: bool, seed: int, n: int = 6, d: int = 3, dv: int = 2, h: int = 2):
    """(x, spec, S_0 or None) of one kind: typical (unit keys unless normalised inside, beta
    in (0, 1), gates in [-1, -0.05], no S_0); beta within 1e-3 of 2; consecutive keys nearly
    parallel with beta = 1 and values nearly equal (u_t cancels); keys of norm 3 and beta up
    to 2 (|1 - beta |k|^2| up to 17: the state grows); values and S_0 near 2^-1000 and gates
    down to -800 (subnormal products and exp(g))."""
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(2, 1, h, n, d))
    v = rng.normal(size=(1, h, n, dv))
    beta = rng.uniform(0, 1, (1, h, n))
    g = -rng.uniform(0.05, 1, (1, h, n) if decay == "gates" else (1, h, n, d))
    s0 = None if kind == "typical" else rng.normal(size=(1, h, d, dv))
    if not l2:
        k /= np.linalg.norm(k, axis=-1, keepdims=True)
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
        v, s0 = 2.0**-1000 * v, 2.0**-1000 * s0
        g = 800 * g
    packed = pack_delta(torch.tensor(beta), None if decay is None else torch.tensor(g))
    spec = _spec(decay, l2)
    return validate(q, k, v, spec, None, packed), spec, s0


VARIANTS = [(kind, decay, l2) for kind in KINDS for decay in DECAYS for l2 in (False, True)]


@pytest.mark.parametrize(("kind", "decay", "l2"), VARIANTS)
def test_mpmath_and_arb_agree_bit_for_bit(kind, decay, l2):
    x, spec, s0 = _case(kind, decay, l2, seed=len(kind) + 3 * l2)
    out_mp, state_mp = mp_delta(x, spec, s0, state=True)
    out_arb, state_arb = arb_delta(x, spec, s0, state=True)
    assert np.array_equal(out_mp, out_arb), np.max(np.abs(out_mp - out_arb))
    assert np.array_equal(state_mp, state_arb), np.max(np.abs(state_mp - state_arb))


# ----------------------------------------------------------------------------- closed forms


def _scalar_inputs(n: int, seed: int):
    """d = dv = 1, k = 1: q, v (1, 1, n, 1) drawn, k ones."""
    rng = np.random.default_rng(seed)
    q, v = rng.normal(size=(2, 1, 1, n, 1))
    return q, np.ones_like(q), v


@pytest.mark.parametrize("decay", [None, "gates"])
@pytest.mark.parametrize("engine_name", ["mp", "arb"])
def test_beta_one_stores_the_last_value(engine_name, decay):
    """d = 1, k = 1, beta = 1: S_t = (1 - 1) D_t S_(t-1) + v_t = v_t whatever the gates, so
    o_t = c q_t v_t, one rounding of the product."""
    q, k, v = _scalar_inputs(9, seed=1)
    g = None if decay is None else -np.linspace(0.1, 2, 9).reshape(q.shape[:3])
    got = reference(q, k, v, "identity", True, engine=engine_name, normalize=False, scale=0.5,
                    decay=decay, g=g, delta_rule=True, beta=np.ones(q.shape[:3]))  # fmt: skip
    assert np.array_equal(got, 0.5 * (q * v))


@pytest.mark.parametrize("engine_name", ["mp", "arb"])
def test_beta_half_averages(engine_name):
    """d = 1, k = 1, beta = 1/2: S_t = S_(t-1)/2 + v_t/2 and o_t = q_t S_t, in exact rationals
    (float(Fraction) rounds to nearest)."""
    q, k, v = _scalar_inputs(12, seed=2)
    s, want = Fraction(0), []
    for qt, vt in zip(q.ravel().tolist(), v.ravel().tolist()):
        s = s / 2 + Fraction(vt) / 2
        want.append(float(Fraction(qt) * s))
    got = reference(q, k, v, "identity", True, engine=engine_name, normalize=False,
                    delta_rule=True, beta=np.full(q.shape[:3], 0.5))  # fmt: skip
    assert np.array_equal(got.ravel(), np.array(want))


def _nearest(value: mpmath.mpf) -> float:
    """The float64 nearest a 300-bit mpf, through an exact Fraction."""
    sign, man, exp, _ = value._mpf_
    return float((-1) ** sign * Fraction(int(man)) * Fraction(2) ** int(exp))


@pytest.mark.parametrize("decay", ["gates", "channel-gates"])
def test_gates_without_updates_decay_the_initial_state(decay):
    """beta = 0: S_t = exp(g_1 + ... + g_t) S_0 (per channel for channel gates), so that
    o_t = c q_t^T S_t; the exponentials in 300-bit mpmath here."""
    x, spec, s0 = _case("beta-near-2", decay, False, seed=4)
    x = type(x)(x.q, x.k, x.v, None, x.dtype, x.decay, np.zeros_like(x.beta))
    d = x.q.shape[3]
    want = np.empty(x.v.shape)
    with mpmath.workprec(300):
        for h in range(x.q.shape[1]):
            g = (
                x.decay[0, h]
                if decay == "channel-gates"
                else np.repeat(x.decay[0, h, :, None], d, 1)
            )
            total = [mpmath.mpf(0)] * d
            for t in range(x.q.shape[2]):
                total = [a + mpmath.mpf(b) for a, b in zip(total, g[t].tolist())]
                rows = [[mpmath.exp(e) * mpmath.mpf(a) for a in r] for e, r in zip(total, s0[0, h])]
                for col in range(x.v.shape[3]):
                    dot = mpmath.fsum(mpmath.mpf(a) * r[col] for a, r in zip(x.q[0, h, t], rows))
                    want[0, h, t, col] = _nearest(dot / mpmath.sqrt(d))
    for name in ("mp", "arb"):
        got = (mp_delta if name == "mp" else arb_delta)(x, spec, s0)[0]
        assert np.array_equal(got, want), name


# ------------------------------------------------------------------------ precision control


@pytest.mark.parametrize("engine_name", ["mp", "arb"])
def test_a_value_absorbed_at_226_bits_is_recovered(engine_name):
    """d = 1, k = 1, beta = 1/2, v = 2^301, 1, -2^299: S = 2^300, 2^299 + 1/2, 1/4. At 113
    and 226 bits alike the 1 is lost (S_3 = 0): agreement alone would accept 0."""
    v = np.array([2.0**301, 1.0, -(2.0**299)]).reshape(1, 1, 3, 1)
    got = reference(np.ones_like(v), np.ones_like(v), v, "identity", True, engine=engine_name,
                    normalize=False, delta_rule=True, beta=np.full((1, 1, 3), 0.5))  # fmt: skip
    assert np.array_equal(got.ravel(), [2.0**300, 2.0**299, 0.25])


def _amplifying(n: int = 60):
    """d = 1, k_t near 3, beta_t near 2 (full 53-bit mantissas): S_t = a_t S_(t-1) + beta_t
    k_t v_t, a_t = 1 - beta_t k_t^2 near -17, v_t the float64 nearest (r_t - a_t S_(t-1)) /
    (beta_t k_t), r_t in [-1, 1]: S_t stays near r_t while each step rounds and amplifies
    every earlier error 17 times (17^60 ~ 2^245); (x, spec, the exact S_t as Fractions)."""
    rng = np.random.default_rng(23)
    k = 3 + rng.uniform(0, 1e-3, n)
    beta = 2 - rng.uniform(0, 1e-3, n)
    s, vs, states = Fraction(0), [], []
    for r, kt, bt in zip(rng.uniform(-1, 1, n).tolist(), k.tolist(), beta.tolist()):
        a, injected = 1 - Fraction(bt) * Fraction(kt) ** 2, Fraction(bt) * Fraction(kt)
        vs.append(float((Fraction(r) - a * s) / injected))
        s = a * s + injected * Fraction(vs[-1])
        states.append(s)
    v = np.array(vs).reshape(1, 1, n, 1)
    spec = _spec(None, False, scale=1.0)
    packed = pack_delta(torch.tensor(beta.reshape(1, 1, n)))
    return validate(np.ones_like(v), k.reshape(v.shape), v, spec, None, packed), spec, states


def test_precision_control_notices_amplified_cancellation():
    """At 256 bits the last outputs are not resolved (the engines raise, rather than return
    them); by default both reach the exact values (o_t = S_t here)."""
    x, spec, states = _amplifying()
    for run in (mp_delta, arb_delta):
        with pytest.raises(ReferenceAccuracyError):
            run(x, spec, max_prec=256)
    want = np.array([float(s) for s in states])
    out_mp, state_mp = mp_delta(x, spec, state=True)
    out_arb, state_arb = arb_delta(x, spec, state=True)
    assert np.array_equal(out_mp.ravel(), want) and np.array_equal(out_arb.ravel(), want)
    assert state_mp.ravel()[0] == state_arb.ravel()[0] == want[-1]


# ------------------------------------------------------------------------ the float64 engine


@pytest.fixture
def short_blocks(monkeypatch):
    """Blocks of 8 tokens: 40 tokens cross five block ends, where transitions may close."""
    monkeypatch.setattr(engine, "BLOCK", 8)


@pytest.mark.parametrize(("kind", "decay", "l2"), VARIANTS)
def test_float64_bound_holds_against_arb(short_blocks, kind, decay, l2):
    x, spec, s0 = _case(kind, decay, l2, seed=7 + len(kind), n=40)
    got = float64_delta(x, spec, s0)
    out, state = arb_delta(x, spec, s0, state=True)
    err = np.abs(got.values - out)
    assert np.all(err <= got.bound), np.max(err / got.bound)
    state_err = np.sqrt(np.sum((got.state - state) ** 2, axis=-2))  # per column, (B, H, dv)
    assert np.all(state_err <= got.state_bound), np.max(state_err / got.state_bound)


@pytest.mark.parametrize("kind", ["injection", "transition"])
def test_the_state_bound_holds_after_each_of_the_first_steps(kind):
    """|S_t[:, c] - exact|_2 <= state_bound after t = 1 .. 4 tokens, 16 heads: from S_0 = 0
    (the injected beta k v^T alone, then in part), and from S_0 with v = 0 (A_t alone;
    keys of norm 3, beta near 2: the dot product's error times |beta| |k|^2 = 18)."""
    x, spec, s0 = _case("beta-near-2" if kind == "injection" else "keys-of-norm-3",
                        None, False, seed=37, n=4, d=3, h=16)  # fmt: skip
    if kind == "injection":
        s0 = None
    else:
        x = type(x)(x.q, x.k, np.zeros_like(x.v), None, x.dtype, None, x.beta)
    for t in range(1, 5):
        part = x.first(t)
        got = float64_delta(part, spec, s0)
        state = arb_delta(part, spec, s0, state=True)[1]
        err = np.sqrt(np.sum((got.state - state) ** 2, axis=-2))
        assert np.all(err <= got.state_bound), (t, np.max(err / got.state_bound))


def test_errors_carried_into_contracting_blocks_stay_bounded(short_blocks):
    """d = 1, blocks of 8: tokens 0-7 amplify errors 17 times each (_amplifying: relative
    error up to 17^8 u ~ 2^-20), tokens 8-15 shrink state and error alike by (1/32)^8 (the
    transition closes), tokens 16-23 by 2^-8 with v = 0: the state keeps its relative error,
    which the errors committed in that block (W) do not cover; rho E_s does."""
    first, spec, _ = _amplifying(8)
    k = np.concatenate([first.k.ravel(), np.ones(16)]).reshape(1, 1, 24, 1)
    beta = np.concatenate([first.beta.ravel(), np.full(8, 1 - 2.0**-5), np.full(8, 0.5)])
    v = np.concatenate([first.v.ravel(), np.zeros(16)]).reshape(k.shape)
    packed = pack_delta(torch.tensor(beta.reshape(1, 1, 24)))
    x = validate(np.ones_like(v), k, v, spec, None, packed)
    got = float64_delta(x, spec)
    out, state = arb_delta(x, spec, state=True)
    assert np.all(np.abs(got.values - out) <= got.bound)
    assert np.all(np.abs(got.state - state)[..., 0, :] <= got.state_bound)


def _plain_recurrence(x, spec, s0) -> np.ndarray:
    """The definition in float64, head by head and token by token, written out here."""
    q, k = x.q, x.k
    if spec.qk_l2norm:
        q, k = (t / np.sqrt(np.sum(t * t, -1, keepdims=True) + QK_L2NORM_EPS) for t in (q, k))
    b_, h_, n, d = q.shape
    out = np.empty(x.v.shape)
    for b in range(b_):
        for h in range(h_):
            s = np.zeros((d, x.v.shape[3])) if s0 is None else s0[b, h].copy()
            for t in range(n):
                if spec.decay == "gates":
                    s = np.exp(x.decay[b, h, t]) * s
                elif spec.decay == "channel-gates":
                    s = np.exp(x.decay[b, h, t])[:, None] * s
                u = x.beta[b, h, t] * (x.v[b, h, t] - s.T @ k[b, h, t])
                s = s + np.outer(k[b, h, t], u)
                out[b, h, t] = spec.scale_for(d) * (s.T @ q[b, h, t])
    return out


@pytest.mark.parametrize("l2", [False, True])
@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("kind", ["typical", "keys-of-norm-3"])
def test_an_independent_recurrence_is_within_the_bound(short_blocks, kind, decay, l2):
    """The bound holds for any evaluation order of the same recurrence."""
    x, spec, s0 = _case(kind, decay, l2, seed=11, n=40)
    plain = _plain_recurrence(x, spec, s0)
    err = np.abs(plain - arb_delta(x, spec, s0)[0])
    bound = float64_delta(x, spec, s0).bound
    assert np.all(err <= bound), np.max(err / bound)


@pytest.mark.parametrize("decay", DECAYS)
def test_typical_long_inputs_are_certified_without_arb(decay):
    x, spec, _ = _case("typical", decay, True, seed=13, n=4096, d=8, dv=8, h=1)
    got = certified_delta(x, spec)
    assert got.recomputed == 0, np.max(got.bound / got.scale)


def test_contraction_keeps_long_undecayed_sequences_certified():
    """Without a decay G_t = 1 and the per-token bound grows linearly, to 1.7 CERTIFIED_SHARE
    of the scale after 2^14 tokens at d = 32; the transitions' contraction holds it at 0.06."""
    x, spec, _ = _case("typical", None, True, seed=29, n=2**14, d=32, dv=4, h=1)
    got = certified_delta(x, spec)
    assert got.recomputed == 0, np.max(got.bound / got.scale)


def test_the_transition_norm_bounds_the_largest_stretch():
    """rho >= |P x| / |x| (in balls) for x P's top right singular vector (numpy's SVD), and
    rho <= d^(1/16) of it and off over (three squarings: _transition_norm)."""
    rng = np.random.default_rng(31)
    p = rng.normal(size=(3, 8, 8)) * np.array([1.0, 1e-3, 1e3])[:, None, None]
    off = np.array([0.0, 1e-3, 1e6])
    rho = engine._transition_norm(p, off)
    with working_precision(256):
        for i in range(3):
            x = np.linalg.svd(p[i])[2][0]
            px = (arb_mat(balls(p[i])) * arb_mat(balls(x[:, None]))).tolist()
            stretch = sum((row[0] ** 2 for row in px), arb(0)).sqrt()
            stretch /= sum((arb(t) ** 2 for t in x.tolist()), arb(0)).sqrt()
            assert rho[i] >= stretch.upper() + off[i]
            assert rho[i] <= 8 ** (1 / 16) * float(stretch.upper()) * (1 + 2**-20) + 2 * off[i]


def test_rows_it_cannot_certify_are_settled_by_arb(monkeypatch):
    x, spec, s0 = _case("beta-near-2", "gates", True, seed=5)
    monkeypatch.setattr(engine, "CERTIFIED_SHARE", 2.0**-80)  # below float64's own rounding
    got = certified_delta(x, spec, s0)
    assert got.recomputed == 2 * 6
    assert np.array_equal(got.values, arb_delta(x, spec, s0)[0])


def test_delta_scale_is_the_largest_column_norm_so_far():
    q = np.array([[3.0, 4.0], [1.0, 0.0], [0.0, 0.0]])  # |q_t| = 5, 1, 0
    norms = np.array([[2.0], [1.0], [3.0]])
    got = delta_scale(q, norms, -0.5)
    assert np.array_equal(got[:, 0], [5.0, 1.0, engine.SCALE_FLOOR])


# ----------------------------------------------------------------------------- wiring


def test_exact_and_exact_state_dispatch_to_the_delta_engines():
    x, spec, _ = _case("typical", "channel-gates", True, seed=17, n=5)
    out, state = exact_delta_state(x, spec)
    assert np.array_equal(exact(x, spec), out)
    assert np.array_equal(exact(x, spec, "arb"), out)
    s, z = exact_state(x, spec)
    assert np.array_equal(s, state) and z is None
    certified = exact(x, spec, "certified")
    assert np.all(np.abs(certified - out) <= engine.CERTIFIED_SHARE * float64_delta(x, spec).scale)


def test_bad_arguments_are_spec_errors():
    x, spec, _ = _case("typical", None, False, seed=19)
    q, k, v = (torch.tensor(t) for t in (x.q, x.k, x.v))
    with pytest.raises(SpecError, match="delta rule"):
        reference(q, k, v, "identity", True, normalize=False, beta=torch.ones(1, 2, 6))
    with pytest.raises(SpecError, match="needs beta"):
        reference(q, k, v, "identity", True, normalize=False, delta_rule=True)
    with pytest.raises(SpecError, match="initial_state"):
        mp_delta(x, spec, np.zeros((1, 2, 3, 3)))
    with pytest.raises(SpecError, match="delta-rule"):
        float64_delta(x, Spec("identity", True))
