"""Exact reference gradients: torch autograd, mpmath finite differences, closed forms,
precision control under cancellation, causality, zero denominators, bad input."""

from __future__ import annotations

from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch

import linattn_verify as lv
from linattn_verify.families import family_of, validate
from linattn_verify.families.dispatch import (
    exact_gradients,
    exact_gradients_and_magnitudes,
    reference_gradients,
)
from linattn_verify.reference.common import ReferenceAccuracyError
from linattn_verify.reference.grad import _refined_gradients
from linattn_verify.specs import Spec, SpecError

ALL = list(lv.FEATURE_MAPS)
PERFORMER = [n for n in ALL if lv.FEATURE_MAPS[n].needs_projection]
NAMES = ("q", "k", "v")


def _w(name: str, d: int, m: int = 4, seed: int = 7) -> np.ndarray | None:
    return np.random.default_rng(seed).standard_normal((m, d)) if name in PERFORMER else None


# --- an independent quadratic attention in torch, written from the formulas in specs.py ---


def _torch_sim(q: torch.Tensor, k: torch.Tensor, name: str, w) -> torch.Tensor:
    """sim(q_i, k_j) for all pairs: (B, H, Nq, Nk)."""
    d = q.shape[-1]
    if name in ("softmax", "taylor"):
        s = q @ k.transpose(-1, -2) / d**0.5
        return torch.exp(s) if name == "softmax" else 1 + s + s * s / 2
    if name == "cosformer":
        nq, nk = q.shape[2], k.shape[2]
        pos = torch.arange(nq)[:, None] - torch.arange(nk)[None, :]
        cos = torch.cos(torch.pi * pos.double() / (2 * max(nq, nk)))
        return (torch.relu(q) @ torch.relu(k).transpose(-1, -2)) * cos

    def phi(x: torch.Tensor) -> torch.Tensor:
        if name == "elu":
            return torch.nn.functional.elu(x) + 1
        if name == "relu":
            return torch.relu(x)
        if name == "identity":
            return x
        wt = torch.tensor(w)
        m = wt.shape[0]
        xs = x * d**-0.25
        p = xs @ wt.T
        h = (xs * xs).sum(-1, keepdim=True) / 2
        if name == "performer-positive":
            return torch.exp(p - h) / m**0.5
        if name == "performer-hyperbolic":
            return torch.exp(-h) / (2 * m) ** 0.5 * torch.cat([torch.exp(p), torch.exp(-p)], -1)
        return torch.exp(h) / m**0.5 * torch.cat([torch.sin(p), torch.cos(p)], -1)

    return phi(q) @ phi(k).transpose(-1, -2)


def _mask(nq: int, nk: int, causal: bool) -> torch.Tensor:
    full = torch.ones(nq, nk, dtype=torch.bool)
    return full.tril() if causal else full


def _torch_gradients(q, k, v, g, name, causal, w, eps, first_row=0):
    """Autograd of sum(out * g) over query rows first_row.. (float64); also the magnitudes
    sum |term| of each gradient element, from the sim's own Jacobians."""
    q, k, v = (torch.tensor(t, requires_grad=True) for t in (q, k, v))
    gt = torch.tensor(g)[:, :, first_row:]
    mask = _mask(q.shape[2], k.shape[2], causal)[first_row:]
    a = torch.where(mask, _torch_sim(q, k, name, w)[:, :, first_row:], 0.0)
    den = eps + a.sum(-1, keepdim=True)
    out = (a @ v) / den
    (out * gt).sum().backward()
    grads = {n: t.grad.numpy() for n, t in zip(NAMES, (q, k, v))}
    with torch.no_grad():
        # b_ij = dL/da_ij = g_i . (v_j - out_i) / D_i: its terms |g_i|.|v_j| + |g_i|.|out_i|
        # over |D_i|; and r_ij = a_ij / D_i
        ag = gt.abs()
        b = torch.einsum("bhic,bhjc->bhij", ag, v.abs()) + (ag * out.abs()).sum(-1, keepdim=True)
        b, r = (torch.where(mask, t / den.abs(), 0.0).abs()[0].numpy() for t in (b, a))
    jq = torch.autograd.functional.jacobian(lambda x: _torch_sim(x, k, name, w), q.detach())
    jk = torch.autograd.functional.jacobian(lambda x: _torch_sim(q.detach(), x, name, w), k)
    jq = np.abs(np.einsum("hijhic->hijc", jq[0, :, first_row:, :, 0, :, first_row:].numpy()))
    jk = np.abs(np.einsum("hijhjc->hijc", jk[0, :, first_row:, :, 0].numpy()))
    scale_q = np.zeros(q.shape[1:])
    scale_q[:, first_row:] = np.einsum("hij,hijc->hic", b, jq)
    scale = {
        "q": scale_q[None],
        "k": np.einsum("hij,hijc->hjc", b, jk)[None],
        "v": np.einsum("hij,hic->hjc", r, np.abs(gt[0].numpy()))[None],
    }
    return grads, scale


def _inputs(seed: int, n: int, d: int = 3, dv: int = 2, heads: int = 2):
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, 1, heads, n, d))
    v, g = rng.standard_normal((2, 1, heads, n, dv))
    q[0, 0, 1, 0] = k[0, 0, 2, 1] = q[0, -1, 3, 2] = 0.0  # exact zeros: relu'(0) convention
    return q, k, v, g


# Float64 autograd evaluates each gradient element as sums of O(N (d + m)) rounded terms
# (a dot product, the sim, b_ij, the sum over keys), so its error is about gamma_n times
# the sum of |terms| with n below ~100: under 1e-14 of `scale`. The reference is within
# one ulp of the exact value. 1e-12 leaves a 100x margin, while a wrong derivative (a
# missing factor or term, a wrong convention at 0) moves an element by O(scale).
TORCH_RTOL = 1e-12


def _assert_matches_torch(ours, torch_grads, scale, where=None):
    for n in NAMES:
        sel = np.ones(ours[n].shape, bool) if where is None else where[n]
        err = np.abs(ours[n] - torch_grads[n])[sel]
        assert np.all(err <= TORCH_RTOL * scale[n][sel]), (
            f"d{n}: max |ref - autograd| / scale = {np.max(err / scale[n][sel])}"
        )


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ALL)
def test_matches_torch_autograd(name, causal):
    n = 5 + ALL.index(name) % 5
    w = _w(name, 3)
    seed = 100 * ALL.index(name) + causal
    while True:  # relu/cosformer: draw until no denominator is exactly 0 (tested below)
        q, k, v, g = _inputs(seed, n)
        a = torch.where(_mask(n, n, causal), _torch_sim(*map(torch.tensor, (q, k)), name, w), 0)
        if torch.all(a.sum(-1) != 0):
            break
        seed += 1000
    ours = reference_gradients(q, k, v, g, Spec(name, causal), w)
    _assert_matches_torch(ours, *_torch_gradients(q, k, v, g, name, causal, w, 0.0))


@pytest.mark.parametrize("name", ["softmax", "relu", "performer-trig", "cosformer"])
def test_matches_torch_autograd_with_eps(name):
    q, k, v, g = _inputs(3, 6)
    w = _w(name, 3)
    ours = reference_gradients(q, k, v, g, Spec(name, True, 0.75), w)
    _assert_matches_torch(ours, *_torch_gradients(q, k, v, g, name, True, w, 0.75))


@pytest.mark.parametrize("causal", [False, True])
def test_zero_denominator_rows_are_nan_and_only_they(causal):
    q, k, v, g = _inputs(5, 6, heads=1)
    k = np.abs(k) + 0.1
    q[0, 0, 1:, 0] = np.abs(q[0, 0, 1:, 0]) + 0.1  # every other row: a positive denominator
    q[0, 0, 0] = [-1.0, -0.5, 0.0]  # relu(q_0) = 0: D_0 = 0, out_0 = 0/0
    ours = reference_gradients(q, k, v, g, Spec("relu", causal))
    used = [0] if causal else list(range(6))  # keys that row 0 uses
    expect_nan = {n: np.zeros(ours[n].shape, bool) for n in NAMES}
    expect_nan["q"][0, 0, 0] = True
    expect_nan["k"][0, 0, used] = expect_nan["v"][0, 0, used] = True
    for n in NAMES:
        np.testing.assert_array_equal(np.isnan(ours[n]), expect_nan[n], err_msg=f"d{n}")
    # the rest is the gradient of the loss without row 0, which row 0 cannot influence
    torch_grads, scale = _torch_gradients(q, k, v, g, "relu", causal, None, 0.0, first_row=1)
    _assert_matches_torch(ours, torch_grads, scale, where={n: ~expect_nan[n] for n in NAMES})


# --- mpmath central differences of the exact forward loss, independent of torch ---


def _mp_loss(q, k, v, g, name, causal, w, eps):
    """sum_i g_i . out_i for one head, in the current mpmath precision, from the formulas."""
    mp = mpmath.mp
    d = len(q[0])

    def phi(x):
        if name == "elu":
            return [t + 1 if t > 0 else mp.exp(t) for t in x]
        xs = [t / mp.root(d, 4) for t in x]
        proj = [mp.fdot(row, xs) for row in w]
        scale = mp.exp(mp.fdot(xs, xs) / 2) / mp.sqrt(len(w))
        return [scale * mp.sin(p) for p in proj] + [scale * mp.cos(p) for p in proj]

    if name == "softmax":
        a = [[mp.exp(mp.fdot(qi, kj) / mp.sqrt(d)) for kj in k] for qi in q]
    else:
        fk = [phi(kj) for kj in k]
        a = [[mp.fdot(phi(qi), f) for f in fk] for qi in q]
    loss = mp.zero
    for i, gi in enumerate(g):
        js = range(i + 1) if causal else range(len(k))
        den = mp.fsum(a[i][j] for j in js) + eps
        out = [mp.fsum(a[i][j] * v[j][c] for j in js) / den for c in range(len(v[0]))]
        loss += mp.fdot(gi, out)
    return loss


@pytest.mark.parametrize(
    ("name", "causal", "eps"),
    [("softmax", False, 0.0), ("performer-trig", True, 0.0), ("elu", True, 0.5)],
)
def test_matches_mpmath_central_differences(name, causal, eps):
    q, k, v, g = _inputs(11, 4, heads=1)
    w = _w(name, 3)
    ours = reference_gradients(q, k, v, g, Spec(name, causal, eps), w)
    step = mpmath.mpf(2) ** -60
    with mpmath.workprec(200):
        # truncation error ~ step^2 |L'''| ~ 2^-120, rounding ~ 2^-200 |L| / step = 2^-140:
        # both far below the ulp of these O(1e-3..1) gradients, so the reference must be
        # within one ulp; 2^-100 absolute covers an exact 0 (causal row 0 sees one key)
        args = {
            n: [[mpmath.mpf(t) for t in row] for row in arr[0, 0].tolist()]
            for n, arr in zip("qkvg", (q, k, v, g))
        }
        wm = None if w is None else [[mpmath.mpf(t) for t in row] for row in w.tolist()]
        for n in NAMES:
            for i, c in np.ndindex(ours[n].shape[2:]):
                values = []
                for sign in (1, -1):
                    moved = {key: [list(row) for row in rows] for key, rows in args.items()}
                    moved[n][i][c] += sign * step
                    loss = _mp_loss(*(moved[key] for key in "qkvg"), name, causal, wm, eps)
                    values.append(loss)
                fd = (values[0] - values[1]) / (2 * step)
                gap = abs(mpmath.mpf(ours[n][0, 0, i, c]) - fd)
                ulp = mpmath.mpf(float(np.spacing(abs(float(fd)))))
                tol = ulp * (1 + mpmath.mpf(2) ** -40) + mpmath.mpf(2) ** -100
                assert gap <= tol, (n, i, c, ours[n][0, 0, i, c], fd)


# --- closed forms ---


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ALL)
def test_single_key_gives_g_and_zeros(name, causal):
    rng = np.random.default_rng(2)
    q, k = np.abs(rng.standard_normal((2, 1, 2, 1, 3))) + 0.1  # relu: a positive denominator
    v, g = rng.standard_normal((2, 1, 2, 1, 2)) * 1e3
    ours = reference_gradients(q, k, v, g, Spec(name, causal), _w(name, 3))
    np.testing.assert_array_equal(ours["v"], g)  # out = v exactly, so dL/dv = g
    np.testing.assert_array_equal(ours["q"], np.zeros_like(q))
    np.testing.assert_array_equal(ours["k"], np.zeros_like(k))


# cosFormer's weights depend on the positions, so identical keys do not give equal weights.
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", [n for n in ALL if n != "cosformer"])
def test_identical_keys_give_the_mean(name, causal):
    rng = np.random.default_rng(4)
    n = 4
    q = np.abs(rng.standard_normal((1, 1, n, 3))) + 0.1
    k = np.broadcast_to(np.abs(rng.standard_normal((1, 1, 1, 3))) + 0.1, (1, 1, n, 3)).copy()
    v, g = rng.standard_normal((2, 1, 1, n, 2))
    ours = reference_gradients(q, k, v, g, Spec(name, causal), _w(name, 3))
    # out_i is the mean of the v_j it sees whatever q_i is: dL/dq = 0 exactly
    np.testing.assert_array_equal(ours["q"], np.zeros_like(q))
    # dL/dv_j = sum over the rows i that see j of g_i / (number of keys row i sees), exactly
    for j, c in np.ndindex(n, 2):
        rows = range(j, n) if causal else range(n)
        want = sum(Fraction(g[0, 0, i, c]) / ((i + 1) if causal else n) for i in rows)
        got = ours["v"][0, 0, j, c]
        assert abs(Fraction(got) - want) < Fraction(float(np.spacing(abs(float(want))))), (j, c)
    # moving every key together leaves each out_i unchanged: the dL/dk_j sum to 0
    total, size = ours["k"].sum(axis=2), np.abs(ours["k"]).sum(axis=2)
    assert np.all(np.abs(total) <= 8 * np.spacing(size)), (total, size)


# --- precision control under cancellation ---


def test_cancellation_is_resolved_to_the_last_bit():
    # d = 1 softmax, logits 225, 75, 0: out_0 = v_0 + O(e^-150), so b_00 = g.(v_0 - out_0)/D
    # cancels ~216 bits, and dL/dq_0 is of the order e^-150 (~2^-216) of its terms.
    q = np.array([15.0, 5.0, 1.0]).reshape(1, 1, 3, 1)
    k = np.array([15.0, 5.0, 0.0]).reshape(1, 1, 3, 1)
    v = np.array([[1.0, -2.0], [0.5, 3.0], [-1.5, 0.25]]).reshape(1, 1, 3, 2)
    g = np.array([[0.75, 1.25], [-1.0, 0.5], [2.0, 1.0]]).reshape(1, 1, 3, 2)
    spec = Spec("softmax")
    x = validate(q, k, v, spec)
    ours = exact_gradients(x, spec, g)
    hooks = family_of(spec).similarity.gradients
    precise = _refined_gradients(x, spec, g, hooks, prec=4096, max_prec=2**14)
    for n in NAMES:
        np.testing.assert_array_equal(ours[n], precise[n], err_msg=f"d{n}")
    # the case is hard: plain float64 gets dL/dq_0 wrong, and 226 bits are not enough
    torch_grads, _ = _torch_gradients(q, k, v, g, "softmax", False, None, 0.0)
    assert abs(torch_grads["q"][0, 0, 0, 0] / ours["q"][0, 0, 0, 0] - 1) > 0.1
    with pytest.raises(ReferenceAccuracyError):
        _refined_gradients(x, spec, g, hooks, prec=113, max_prec=226)


@pytest.mark.parametrize(("name", "causal"), [("softmax", False), ("performer-trig", True)])
def test_a_huge_constant_column_of_v_changes_no_gradient(name, causal):
    # With v_j0 = c for every key, out_i0 = c exactly (eps = 0) and L = c sum_i g_i0 +
    # sum_i g_i1 out_i1: no gradient depends on c. With c = 2^500, g_i . v_j needs ~600
    # bits; at 113 and 226 bits the part g_i1 v_j1 is lost in it the same way (and b_ij
    # with it); only the error estimate sends the computation further.
    q, k, v, g = _inputs(31, 5)
    w = _w(name, 3)
    v[..., 0] = 0.0
    plain = reference_gradients(q, k, v, g, Spec(name, causal), w)
    v[..., 0] = 2.0**500
    shifted = reference_gradients(q, k, v, g, Spec(name, causal), w)
    for n in NAMES:
        np.testing.assert_array_equal(shifted[n], plain[n], err_msg=f"d{n}")
    assert np.all(np.abs(plain["q"][:, :, 1:]) > 1e-6)  # not a vacuous 0 == 0 (row 0: causal)


# --- causality ---


@pytest.mark.parametrize("name", ["softmax", "performer-trig", "cosformer"])
def test_causal_gradients_ignore_earlier_rows_of_g(name):
    q, k, v, g = _inputs(21, 7)
    q = np.abs(q) + 0.1  # cosformer: no zero denominators
    w = _w(name, 3)
    j0 = 3
    g2 = g.copy()
    g2[:, :, :j0] = np.random.default_rng(22).standard_normal(g2[:, :, :j0].shape)
    one = reference_gradients(q, k, v, g, Spec(name, True), w)
    two = reference_gradients(q, k, v, g2, Spec(name, True), w)
    for n in NAMES:  # dL/dk_j, dL/dv_j for j >= j0 (and dL/dq_i for i >= j0): identical
        np.testing.assert_array_equal(one[n][:, :, j0:], two[n][:, :, j0:], err_msg=f"d{n}")
        assert np.any(one[n][:, :, :j0] != two[n][:, :, :j0]), f"d{n}: g changed nothing"


# --- bad input ---


def test_g_of_the_wrong_shape_is_a_spec_error():
    q, k, v, g = _inputs(0, 4)
    with pytest.raises(SpecError, match=r"g must have the shape .*\(1, 2, 4, 2\).*\(1, 2, 4, 3\)"):
        reference_gradients(q, k, v, np.zeros((1, 2, 4, 3)), Spec("elu"))
    spec = Spec("elu")
    with pytest.raises(SpecError, match="g must have the shape"):
        exact_gradients(validate(q, k, v, spec), spec, g[0])
    g[0, 0, 0, 0] = np.nan
    with pytest.raises(SpecError, match="g has a non-finite value"):
        reference_gradients(q, k, v, g, Spec("elu"))


def test_torch_inputs_are_taken_exactly():
    q, k, v, g = _inputs(8, 5)
    as_torch = [torch.tensor(t, dtype=torch.float32) for t in (q, k, v, g)]
    ours = reference_gradients(*as_torch, Spec("softmax", True))
    again = reference_gradients(*(t.double().numpy() for t in as_torch), Spec("softmax", True))
    for n in NAMES:
        np.testing.assert_array_equal(ours[n], again[n])


@pytest.mark.parametrize(
    ("name", "normalize", "decay"),
    [("relu", True, "gates"), ("elu", False, "gates"), ("elu", True, None), ("relu", True, None)],
)
def test_the_shared_evaluation_gives_the_exact_gradients_of_the_separate_one(
    name, normalize, decay
):
    """exact_gradients_and_magnitudes' refinement starts from the evaluation that also gives
    the general magnitudes (exact-zero shortcuts and all): its values are exact_gradients'."""
    gen = np.random.default_rng(7)
    q, k = gen.standard_normal((2, 1, 2, 5, 3))
    v, g_out = gen.standard_normal((2, 1, 2, 5, 2))
    q[0, 0, 1], k[0, 1, 2] = 0, 0  # a zero query row and key row: the shortcuts' rows
    spec = Spec(name, True, eps=1e-3 * normalize, normalize=normalize, decay=decay)
    gates = np.log(gen.uniform(0.3, 1, (1, 2, 5))) if decay else None
    x = validate(q, k, v, spec, None, gates)
    shared, _ = exact_gradients_and_magnitudes(x, spec, g_out)
    separate = exact_gradients(x, spec, g_out)
    assert sorted(shared) == sorted(separate)
    for key, values in separate.items():
        assert np.array_equal(shared[key], values, equal_nan=True), key
