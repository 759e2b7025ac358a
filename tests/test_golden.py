"""Tests of the golden implementation against definitions written out here, not against itself.

The yardstick is a naive float64 NumPy loop over (b, h, i, j) that evaluates each
similarity literally from docs/contract.md ("The specs"). Tolerances are derived from the unit
roundoff with the standard model of floating-point arithmetic (Higham, "Accuracy and
Stability of Numerical Algorithms", ch. 3): a computed similarity errs by at most
u * K * A_ij, A_ij the similarity evaluated with absolute values (A = sim for the positive
maps), K from the input magnitudes (`weight_units`), and a perturbation of relative size
delta in every weight moves output row i by at most
    delta * (sum_j A_ij |v_j| + |out_i| sum_j A_ij) / |den_i|        (`error_bound`).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from linattn_verify.families import golden_attention, golden_forms, long_form
from linattn_verify.families.channel_gates import golden as channel_gates_golden
from linattn_verify.families.kernelised import golden
from linattn_verify.implementations import GOLDEN_FORMS
from linattn_verify.inputs import UNIT_ROUNDOFF
from linattn_verify.sampling import sample_projection
from linattn_verify.specs import FEATURE_MAPS, RSQRT_D, Spec, SpecError

# identity's denominators are signed and near 0 on these random inputs (0/0 with zero
# keys): its golden forms are tested in test_decay_reference.py
NAMES = [name for name in FEATURE_MAPS if name != "identity"]
KERNELISED = [name for name in NAMES if FEATURE_MAPS[name].kernelised]
PERFORMERS = [name for name, fm in FEATURE_MAPS.items() if fm.needs_projection]
LOW_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
U64 = UNIT_ROUNDOFF["float64"]
U32 = UNIT_ROUNDOFF["float32"]
FP16_SUBNORMAL_HALF_SPACING = 2.0**-25  # absolute rounding error below 2^-14 in float16


# ------------------------------------------------------------------------ the inputs


def make_inputs(
    name: str,
    b: int,
    h: int,
    nq: int,
    nk: int,
    d: int,
    dv: int,
    m: int,
    seed: int,
    dtype: torch.dtype = torch.float64,
    scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """q, k (times `scale`), v (and W for the Performer maps) from `seed`, in `dtype`.

    For relu and cosformer, component 0 of every q and k is made positive, so no
    denominator is 0 (the other components keep their signs, so relu still matters).
    """
    gen = torch.Generator().manual_seed(seed)
    q = scale * torch.randn(b, h, nq, d, generator=gen, dtype=torch.float64)
    k = scale * torch.randn(b, h, nk, d, generator=gen, dtype=torch.float64)
    v = torch.randn(b, h, nk, dv, generator=gen, dtype=torch.float64)
    if name in ("relu", "cosformer"):
        q[..., 0] = q[..., 0].abs() + 0.25 * scale
        k[..., 0] = k[..., 0].abs() + 0.25 * scale
    w = None
    if FEATURE_MAPS[name].needs_projection:
        w = torch.from_numpy(sample_projection(m, d, "iid", seed)).to(dtype)
    return q.to(dtype), k.to(dtype), v.to(dtype), w


def f64(x: torch.Tensor | None) -> np.ndarray | None:
    """Exact float64 NumPy copy (every dtype here widens exactly)."""
    return None if x is None else x.detach().to(torch.float64).cpu().numpy()


# ---------------------------------------------------------- the naive float64 loop


def naive_phi(name: str, x: np.ndarray, w: np.ndarray | None) -> np.ndarray:
    """phi(x) for one token x (d,), feature by feature, as docs/contract.md writes it."""
    d = x.shape[0]
    if name == "elu":  # elu(x) + 1 = x + 1 for x > 0, exp(x) otherwise
        return np.array([xc + 1.0 if xc > 0 else math.exp(xc) for xc in x])
    if name == "relu":
        return np.array([max(xc, 0.0) for xc in x])
    if name == "identity":
        return np.array(x, dtype=np.float64)
    xs = x * d**-0.25
    sq = float(np.dot(xs, xs))
    m = w.shape[0]
    wx = [float(np.dot(w[f], xs)) for f in range(m)]
    if name == "performer-positive":
        return np.array([math.exp(t - sq / 2) / math.sqrt(m) for t in wx])
    if name == "performer-hyperbolic":
        pos = [math.exp(-sq / 2) / math.sqrt(2 * m) * math.exp(t) for t in wx]
        neg = [math.exp(-sq / 2) / math.sqrt(2 * m) * math.exp(-t) for t in wx]
        return np.array(pos + neg)
    if name == "performer-trig":
        sin = [math.exp(sq / 2) / math.sqrt(m) * math.sin(t) for t in wx]
        cos = [math.exp(sq / 2) / math.sqrt(m) * math.cos(t) for t in wx]
        return np.array(sin + cos)
    raise AssertionError(name)


def naive_sims(
    name: str, q: np.ndarray, k: np.ndarray, causal: bool, w: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """(sim, A) of shape (B, H, Nq, Nk): sim_ij (0 where masked) and its absolute version."""
    bsz, nh, nq, d = q.shape
    nk = k.shape[2]
    big_m = max(nq, nk)
    sim = np.zeros((bsz, nh, nq, nk))
    absim = np.zeros((bsz, nh, nq, nk))
    for b in range(bsz):
        for h in range(nh):
            kernelised = name not in ("softmax", "taylor", "cosformer")
            if kernelised:
                phi_q = [naive_phi(name, q[b, h, i], w) for i in range(nq)]
                phi_k = [naive_phi(name, k[b, h, j], w) for j in range(nk)]
            for i in range(nq):
                for j in range(nk):
                    if causal and j > i:
                        continue
                    qi, kj = q[b, h, i], k[b, h, j]
                    if name == "softmax":
                        s = math.exp(float(np.dot(qi, kj)) / math.sqrt(d))
                        a = s
                    elif name == "taylor":
                        t = float(np.dot(qi, kj)) / math.sqrt(d)
                        s = 1.0 + t + t * t / 2
                        t_abs = float(np.dot(np.abs(qi), np.abs(kj))) / math.sqrt(d)
                        a = 1.0 + t_abs + t_abs * t_abs / 2
                    elif name == "cosformer":
                        rq, rk = np.maximum(qi, 0.0), np.maximum(kj, 0.0)
                        s = float(np.dot(rq, rk)) * math.cos(math.pi * (i - j) / (2 * big_m))
                        a = s
                    else:
                        s = float(np.dot(phi_q[i], phi_k[j]))
                        a = float(np.dot(np.abs(phi_q[i]), np.abs(phi_k[j])))
                    sim[b, h, i, j] = s
                    absim[b, h, i, j] = a
    return sim, absim


def naive_attention(
    name: str,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    causal: bool,
    eps: float,
    w: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(out, sim, A): out_i = sum_j sim_ij v_j / (eps + sum_j sim_ij), in float64."""
    sim, absim = naive_sims(name, q, k, causal, w)
    out = np.einsum("bhij,bhjc->bhic", sim, v) / (eps + sim.sum(-1, keepdims=True))
    return out, sim, absim


# ------------------------------------------------------------------ the tolerances


def weight_units(name: str, q: np.ndarray, k: np.ndarray, w: np.ndarray | None) -> float:
    """K: each computed weight errs by at most K u A_ij (u of the compute dtype).

    A d-term dot product errs by gamma_d ~ d u times its sum of |products|; an absolute
    error e in an exponent is a relative error e in exp; each elementwise operation
    (exp, sin, cos, +1, scaling) adds at most 2u.
    """
    d = q.shape[-1]
    nq, nk = q.shape[-2], k.shape[-2]
    abs_dot = np.einsum("bhic,bhjc->bhij", np.abs(q), np.abs(k)).max() / math.sqrt(d)
    if name == "softmax":  # l_ij and its row max each err by (d + 1) u |q||k|/sqrt(d)
        return (2 * d + 6) * abs_dot + 4
    if name in ("elu", "relu"):
        return d + 6
    if name == "taylor":  # |ds| (1 + |s|) + 3u (1 + |s| + s^2/2) <= 2 (d + 4) u A
        return 2 * d + 10
    if name == "cosformer":  # cos near pi/2: relative error u theta tan(theta) <= u M
        return d + 3 * max(nq, nk) + 8

    def exponent_units(x: np.ndarray) -> float:
        xs = np.abs(x) * d**-0.25
        p = (xs @ np.abs(w).T).max()  # |W| |x'|: bounds |W x'| and its rounding error
        half_sq = 0.5 * (xs * xs).sum(-1).max()
        return (d + 4) * (p + half_sq + 1) + 2 * (p + half_sq + math.log(2 * w.shape[0]))

    return exponent_units(q) + exponent_units(k) + 8


def total_units(name: str, q: np.ndarray, k: np.ndarray, w: np.ndarray | None) -> float:
    """K plus the sums: F features per weight (linear form), N keys per row, division."""
    d, nk = q.shape[-1], k.shape[-2]
    fm = FEATURE_MAPS[name]
    n_feat = fm.feature_dim(d, None if w is None else w.shape[0]) if fm.kernelised else d
    return weight_units(name, q, k, w) + n_feat + nk + 8


def error_bound(
    units: float, sim: np.ndarray, absim: np.ndarray, v: np.ndarray, out: np.ndarray, eps: float
) -> np.ndarray:
    """units * (sum_j A_ij |v_j| + |out_i| sum_j A_ij) / |eps + sum_j sim_ij|, per element."""
    den = np.abs(eps + sim.sum(-1, keepdims=True))
    spread = np.einsum("bhij,bhjc->bhic", absim, np.abs(v))
    return units * (spread + np.abs(out) * absim.sum(-1, keepdims=True)) / den


def assert_within(got: torch.Tensor, want: np.ndarray, tol: np.ndarray, what: str) -> None:
    """Every element within its tolerance; the message names the worst one."""
    err = np.abs(f64(got) - want)
    assert np.all(np.isfinite(f64(got))), f"{what}: non-finite output"
    ratio = err / tol
    worst = np.unravel_index(np.argmax(ratio), ratio.shape)
    assert ratio[worst] <= 1.0, (
        f"{what}: |err| = {err[worst]:.3e} > tol {tol[worst]:.3e} at {worst} "
        f"(got {f64(got)[worst]!r}, want {want[worst]!r})"
    )


def spec_for(name: str, causal: bool, eps: float = 0.0) -> Spec:
    return Spec(name, causal=causal, eps=eps)


def forms_for(name: str) -> list[str]:
    return list(GOLDEN_FORMS) if FEATURE_MAPS[name].kernelised else ["quadratic"]


# ------------------------------------------------------------ agreement with the loop


@pytest.mark.parametrize("eps", [0.0, 0.3])
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name", NAMES)
def test_float64_matches_naive_loop(name: str, causal: bool, eps: float) -> None:
    nq, nk = (7, 7) if causal else (5, 7)
    q, k, v, w = make_inputs(name, 2, 2, nq, nk, d=4, dv=3, m=6, seed=11)
    spec = spec_for(name, causal, eps)
    want, sim, absim = naive_attention(name, f64(q), f64(k), f64(v), causal, eps, f64(w))
    # both sides err by at most U64 * units * scale; the bound is ~1e-13 relative here
    tol = (
        2
        * U64
        * error_bound(total_units(name, f64(q), f64(k), f64(w)), sim, absim, f64(v), want, eps)
    )
    for form in forms_for(name):
        out = golden_attention(q, k, v, spec, projection=w, form=form)
        assert out.shape == (2, 2, nq, 3) and out.dtype == torch.float64
        assert_within(out, want, tol, f"{spec} {form}")


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name", KERNELISED)
def test_linear_form_matches_quadratic_form(name: str, causal: bool) -> None:
    nq, nk = (9, 9) if causal else (6, 9)
    q, k, v, w = make_inputs(name, 2, 3, nq, nk, d=5, dv=4, m=7, seed=23)
    spec = spec_for(name, causal)
    _, sim, absim = naive_attention(name, f64(q), f64(k), f64(v), causal, 0.0, f64(w))
    quad = golden_attention(q, k, v, spec, projection=w, form="quadratic")
    lin = golden_attention(q, k, v, spec, projection=w, form="linear")
    units = total_units(name, f64(q), f64(k), f64(w))
    tol = 2 * U64 * error_bound(units, sim, absim, f64(v), f64(quad), 0.0)
    assert_within(lin, f64(quad), tol, f"{spec} linear vs quadratic")


# ----------------------------------------------------------------------- closed forms


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name", NAMES)
def test_constant_values_give_that_value(name: str, causal: bool) -> None:
    nq, nk = (8, 8) if causal else (5, 8)
    q, k, _, w = make_inputs(name, 2, 2, nq, nk, d=4, dv=3, m=6, seed=5)
    const = torch.tensor([1.5, -0.25, 3.0], dtype=torch.float64)
    v = const.expand(2, 2, nk, 3)  # a stride-0 view: non-contiguous too
    want = np.broadcast_to(f64(const), (2, 2, nq, 3))
    _, sim, absim = naive_attention(name, f64(q), f64(k), f64(v), causal, 0.0, f64(w))
    tol = U64 * error_bound(
        total_units(name, f64(q), f64(k), f64(w)), sim, absim, f64(v), want, 0.0
    )
    for form in forms_for(name):
        out = golden_attention(q, k, v, spec_for(name, causal), projection=w, form=form)
        assert_within(out, want, tol, f"{name} {form} constant v")


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name", NAMES)
def test_single_key_gives_its_value(name: str, causal: bool) -> None:
    nq = 1 if causal else 3  # causal needs Nq = Nk = 1; non-causal: every query sees v_0
    q, k, v, w = make_inputs(name, 2, 2, nq, 1, d=4, dv=3, m=6, seed=7)
    want = np.broadcast_to(f64(v), (2, 2, nq, 3))
    # errors in phi cancel exactly (out = v_0 for any sim); only the F-term dot products of
    # phi(q_i) with phi(k_0) v_0 and with phi(k_0) round (the linear form), then the division
    _, sim, absim = naive_attention(name, f64(q), f64(k), f64(v), causal, 0.0, f64(w))
    fm = FEATURE_MAPS[name]
    n_feat = fm.feature_dim(4, 6) if fm.kernelised else 4
    tol = U64 * error_bound(n_feat + 8, sim, absim, f64(v), want, 0.0)
    for form in forms_for(name):
        out = golden_attention(q, k, v, spec_for(name, causal), projection=w, form=form)
        assert_within(out, want, tol, f"{name} {form} N=1")


def running_mean(v: np.ndarray) -> np.ndarray:
    return np.cumsum(v, axis=2) / np.arange(1, v.shape[2] + 1)[:, None]


# sim(q, 0) does not depend on q for these maps, so every key weighs the same for a query
ZERO_KEY_MAPS = [n for n in NAMES if n not in ("relu", "cosformer")]


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name", ZERO_KEY_MAPS)
def test_zero_keys_give_mean_of_values(name: str, causal: bool) -> None:
    n = 9
    q, _, v, w = make_inputs(name, 2, 2, n, n, d=4, dv=3, m=6, seed=13)
    k = torch.zeros_like(q)
    vv = f64(v)
    want = running_mean(vv) if causal else np.broadcast_to(vv.mean(2, keepdims=True), vv.shape)
    fm = FEATURE_MAPS[name]
    n_feat = fm.feature_dim(4, 6) if fm.kernelised else 4
    # equal weights: only the sums round; |out| and the mean are <= max |v|
    tol = U64 * (2 * n + n_feat + 8) * 2 * np.abs(vv).max()
    for form in forms_for(name):
        out = golden_attention(q, k, v, spec_for(name, causal), projection=w, form=form)
        assert_within(out, want, np.full(want.shape, tol), f"{name} {form} zero keys")


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name", ["softmax", "taylor"])
def test_zero_queries_give_mean_of_values(name: str, causal: bool) -> None:
    # sim(0, k) = 1 for softmax and taylor (s = 0); not so for elu: phi(0) = 1 but
    # phi(0).phi(k) = sum_c phi(k)_c still depends on k.
    n = 9
    _, k, v, _ = make_inputs(name, 2, 2, n, n, d=4, dv=3, m=6, seed=17)
    q = torch.zeros_like(k)
    vv = f64(v)
    want = running_mean(vv) if causal else np.broadcast_to(vv.mean(2, keepdims=True), vv.shape)
    tol = U64 * (2 * n + 8) * 2 * np.abs(vv).max()
    for form in forms_for(name):
        out = golden_attention(q, k, v, spec_for(name, causal), form=form)
        assert_within(out, want, np.full(want.shape, tol), f"{name} {form} zero queries")


def test_elu_zero_queries_and_keys_give_mean_of_values() -> None:
    q, k, v, _ = make_inputs("elu", 2, 2, 6, 6, d=4, dv=3, m=6, seed=19)
    vv = f64(v)
    for causal in (False, True):
        want = running_mean(vv) if causal else np.broadcast_to(vv.mean(2, keepdims=True), vv.shape)
        for form in GOLDEN_FORMS:
            out = golden_attention(
                torch.zeros_like(q), torch.zeros_like(k), v, spec_for("elu", causal), form=form
            )
            tol = np.full(want.shape, U64 * 40 * np.abs(vv).max())
            assert_within(out, want, tol, f"elu {form} causal={causal} zero q and k")


# --------------------------------------------------------------- dtypes and accuracy


@pytest.mark.parametrize("dtype_name", list(LOW_DTYPES))
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name", NAMES)
def test_low_precision_inputs_are_accumulated_wide(
    name: str, causal: bool, dtype_name: str
) -> None:
    """fp16/bf16/fp32 inputs: input dtype out, within one output rounding of the exact
    answer plus a float32 computation's error (the wide accumulation) on these inputs.

    q, k are scaled by 1/2: at unit scale the trig estimator's denominator cancels so much
    (condition ~ 1e3) that a float32 computation's error bound exceeds a float16 rounding.
    """
    dtype = LOW_DTYPES[dtype_name]
    nq, nk = (16, 16) if causal else (12, 16)
    q, k, v, w = make_inputs(name, 2, 2, nq, nk, d=8, dv=4, m=16, seed=29, dtype=dtype, scale=0.5)
    want, sim, absim = naive_attention(name, f64(q), f64(k), f64(v), causal, 0.0, f64(w))
    u_out = UNIT_ROUNDOFF[dtype_name]
    units = total_units(name, f64(q), f64(k), f64(w))
    compute = error_bound(units, sim, absim, f64(v), want, 0.0)  # per unit roundoff
    tol = u_out * np.abs(want) + (1 + u_out) * (U32 + U64) * compute
    if dtype == torch.float16:
        tol = tol + FP16_SUBNORMAL_HALF_SPACING
    # the float32 computation error must be far below one output rounding for fp16/bf16,
    # or this test could not see a low-precision accumulator
    if dtype != torch.float32:
        assert U32 * compute.max() < 0.25 * u_out * np.abs(f64(v)).max()
    for form in forms_for(name):
        out = golden_attention(q, k, v, spec_for(name, causal), projection=w, form=form)
        assert out.dtype == dtype and out.device == q.device and out.shape == (2, 2, nq, 4)
        assert_within(out, want, tol, f"{name} causal={causal} {dtype_name} {form}")


def test_float16_long_sequence_needs_wide_accumulation() -> None:
    """A float16 accumulator over 512 keys errs by ~ N 2^-11; the golden one must not."""
    n = 512
    q, k, v, _ = make_inputs("elu", 1, 2, n, n, d=8, dv=4, m=1, seed=31, dtype=torch.float16)
    v = (v.abs() + 1.0).to(torch.float16)  # positive v: errors of the sums cannot cancel
    # per-token naive features; the (i, j) loop replaced by a float64 matrix product
    phi_q = np.array([[naive_phi("elu", x, None) for x in head] for head in f64(q)[0]])
    phi_k = np.array([[naive_phi("elu", x, None) for x in head] for head in f64(k)[0]])
    full = (phi_q @ phi_k.transpose(0, 2, 1))[None]
    u16 = UNIT_ROUNDOFF["float16"]
    for causal in (False, True):
        sim = np.tril(full) if causal else full
        want = (sim @ f64(v)) / sim.sum(-1, keepdims=True)
        compute = error_bound(total_units("elu", f64(q), f64(k), None), sim, sim, f64(v), want, 0.0)
        tol = u16 * np.abs(want) + (1 + u16) * (U32 + U64) * compute
        for form in GOLDEN_FORMS:
            out = golden_attention(q, k, v, spec_for("elu", causal), form=form)
            assert_within(out, want, tol, f"elu causal={causal} float16 N={n} {form}")


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name", PERFORMERS)
def test_performer_large_norms_do_not_overflow_float32(name: str, causal: bool) -> None:
    """|x| = 30, d = 16: |x'|^2/2 = 112.5, beyond float32's exp range (~88.7).

    The norms differ between (b, h) slices, down to 1, so a shift shared across slices
    (instead of one per (b, h)) would underflow the features of the small ones.
    """
    d, m, n = 16, 32, 12
    gen = torch.Generator().manual_seed(37)

    def on_sphere(radii: list[list[float]]) -> torch.Tensor:
        x = torch.randn(2, 2, n, d, generator=gen, dtype=torch.float64)
        radius = torch.tensor(radii, dtype=torch.float64)[:, :, None, None]
        return (radius * x / x.norm(dim=-1, keepdim=True)).to(torch.float32)

    q = on_sphere([[30.0, 2.0], [30.0, 8.0]])
    k = on_sphere([[30.0, 1.0], [4.0, 30.0]])
    v = torch.randn(2, 2, n, 3, generator=gen, dtype=torch.float64).to(torch.float32)
    w = torch.from_numpy(sample_projection(m, d, "iid", 37)).to(torch.float32)
    spec = spec_for(name, causal)

    # the literal float32 evaluation breaks down here (exp overflows or every product
    # underflows), so the finite result below is the shifted evaluation's doing
    def literal_phi(x: torch.Tensor) -> torch.Tensor:
        xs = x * d**-0.25
        proj, sq = xs @ w.T, (xs * xs).sum(-1, keepdim=True) / 2
        if name == "performer-positive":
            return torch.exp(proj - sq) / math.sqrt(m)
        if name == "performer-hyperbolic":
            both = torch.cat([torch.exp(proj), torch.exp(-proj)], -1)
            return torch.exp(-sq) / math.sqrt(2 * m) * both
        return torch.exp(sq) / math.sqrt(m) * torch.cat([torch.sin(proj), torch.cos(proj)], -1)

    lit = literal_phi(q) @ literal_phi(k).transpose(-2, -1)
    literal = (lit @ v) / lit.sum(-1, keepdim=True)
    assert not torch.isfinite(literal).all()

    want, sim, absim = naive_attention(name, f64(q), f64(k), f64(v), causal, 0.0, f64(w))
    assert np.all(np.isfinite(want))
    units = total_units(name, f64(q), f64(k), f64(w))
    tol = (U32 + U64) * error_bound(units, sim, absim, f64(v), want, 0.0)
    for form in GOLDEN_FORMS:
        out = golden_attention(q, k, v, spec, projection=w, form=form)
        assert out.dtype == torch.float32
        assert_within(out, want, tol, f"{spec} {form} |x| = 30 float32")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_elu_of_very_negative_inputs_does_not_cancel(causal: bool, dtype: torch.dtype) -> None:
    """elu(x) + 1 = exp(x) for x <= 0: formed as (exp(x) - 1) + 1 it cancels (to 0 in
    float32 below x ~ -17, leaving 0/0), formed as exp(x) it is accurate."""
    q, k, v, _ = make_inputs("elu", 2, 2, 6, 6, d=4, dv=3, m=1, seed=53, dtype=torch.float64)
    q = (-15.0 - 15.0 * q.abs()).to(dtype)  # every component in (-inf, -15]
    k = (-15.0 - 5.0 * k.abs()).to(dtype)
    v = v.to(dtype)
    want, sim, absim = naive_attention("elu", f64(q), f64(k), f64(v), causal, 0.0, None)
    units = total_units("elu", f64(q), f64(k), None)
    u = UNIT_ROUNDOFF[str(dtype).removeprefix("torch.")]
    tol = (u + U64) * error_bound(units, sim, absim, f64(v), want, 0.0)
    for form in GOLDEN_FORMS:
        out = golden_attention(q, k, v, spec_for("elu", causal), form=form)
        assert_within(out, want, tol, f"elu causal={causal} {dtype} {form} x <= -15")


# -------------------------------------------------------------- layout and batching


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name", NAMES)
def test_non_contiguous_inputs_match_contiguous(name: str, causal: bool) -> None:
    bsz, nh, d, dv, m = 2, 3, 4, 3, 5
    nq, nk = (6, 6) if causal else (4, 6)
    gen = torch.Generator().manual_seed(41)
    # (B, N, H, d) tensors viewed as (B, H, N, d); v as every other column; W as a transpose
    q = torch.randn(bsz, nq, nh, d, generator=gen, dtype=torch.float64).transpose(1, 2)
    k = torch.randn(bsz, nk, nh, d, generator=gen, dtype=torch.float64).transpose(1, 2)
    v = torch.randn(bsz, nh, nk, 2 * dv, generator=gen, dtype=torch.float64)[..., ::2]
    if name in ("relu", "cosformer"):
        q, k = q.abs(), k.abs()
    w = None
    if FEATURE_MAPS[name].needs_projection:
        w = torch.from_numpy(sample_projection(d, m, "iid", 41)).T  # (m, d), strides (1, m)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    spec = spec_for(name, causal)
    want, sim, absim = naive_attention(name, f64(q), f64(k), f64(v), causal, 0.0, f64(w))
    tol = (
        2
        * U64
        * error_bound(total_units(name, f64(q), f64(k), f64(w)), sim, absim, f64(v), want, 0.0)
    )
    for form in forms_for(name):
        strided = golden_attention(q, k, v, spec, projection=w, form=form)
        wc = None if w is None else w.contiguous()
        dense = golden_attention(
            q.contiguous(), k.contiguous(), v.contiguous(), spec, projection=wc, form=form
        )
        assert_within(strided, f64(dense), tol, f"{spec} {form} strided vs contiguous")
        assert_within(strided, want, tol, f"{spec} {form} strided vs naive")


# --------------------------------------------------------------------- zero denominator


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("form", GOLDEN_FORMS)
def test_relu_negative_queries_give_nan_without_eps_and_zero_with_eps(
    form: str, causal: bool
) -> None:
    q, k, v, _ = make_inputs("relu", 2, 2, 6, 6, d=4, dv=3, m=1, seed=43)
    q[:, :, 2] = -(q[:, :, 2].abs() + 0.1)  # relu(q_2) = 0: row 2 has no positive sim
    others = [i for i in range(6) if i != 2]
    nan_out = golden_attention(q, k, v, spec_for("relu", causal), form=form)
    assert torch.isnan(nan_out[:, :, 2]).all()
    assert torch.isfinite(nan_out[:, :, others]).all()
    zero_out = golden_attention(q, k, v, spec_for("relu", causal, eps=0.5), form=form)
    assert (zero_out[:, :, 2] == 0).all()
    assert torch.isfinite(zero_out).all()


# ------------------------------------- the linear form of scaled, unnormalised, decayed specs


def phi64(name: str, x: np.ndarray, w: np.ndarray | None) -> np.ndarray:
    """phi(x) of every token (.., N, d) in float64, as docs/contract.md writes it."""
    if name == "elu":
        return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "identity":
        return x
    assert name == "performer-positive", name
    xs = x * x.shape[-1] ** -0.25
    return np.exp(xs @ w.T - (xs * xs).sum(-1, keepdims=True) / 2) / math.sqrt(w.shape[0])


def decay_weights(spec: Spec, decay: np.ndarray, rows: slice, n: int) -> np.ndarray:
    """w_ij of rows i, 0 where j > i, in float64: gamma^(i - j) (1, H, r, N), exp(G_i - G_j)
    (B, H, r, N) or per key channel (B, H, r, N, d), G the prefix sums of the log-gates
    (Sun et al. 2023, eq. 5; Yang et al. 2024, eq. 3 and sec. 4.1)."""
    i, j = np.arange(n)[rows, None], np.arange(n)[None, :]
    if spec.decay == "constant":
        log_w = (i - j) * np.log(decay)[None, :, None, None]
    elif spec.decay == "gates":
        prefix = np.cumsum(decay, axis=-1)
        log_w = prefix[..., rows, None] - prefix[..., None, :]
    else:
        prefix = np.cumsum(decay, axis=-2)
        log_w = prefix[..., rows, None, :] - prefix[..., None, :, :]
        i, j = i[..., None], j[..., None]
    return np.where(i >= j, np.exp(np.minimum(log_w, 0.0)), 0.0)


def error_scale(
    spec: Spec, q: np.ndarray, k: np.ndarray, v: np.ndarray, w: np.ndarray | None, decay
) -> np.ndarray:
    """Per element, what a relative perturbation of every weight moves the output by: c
    sum_j w_ij A_ij |v_j| unnormalised, (c sum_j w_ij A_ij |v_j| + |out_i| c sum_j w_ij
    A_ij) / |eps + c sum_j w_ij sim_ij| normalised, A_ij = |phi(q_i)| . |phi(k_j)| (channel
    gates: sum_m |phi(q_i)_m| |phi(k_j)_m| w_ijm); computed 256 rows at a time."""
    n, c = k.shape[-2], spec.scale_for(q.shape[-1])
    phi_q, phi_k = phi64(spec.feature_map, q, w), phi64(spec.feature_map, k, w)
    parts = []
    for start in range(0, q.shape[-2], 256):
        rows = slice(start, start + 256)
        pq = phi_q[..., rows, :]
        if spec.decay == "channel-gates":
            weights = decay_weights(spec, decay, rows, n)
            sim = c * np.einsum("bhim,bhjm,bhijm->bhij", pq, phi_k, weights)
            absim = c * np.einsum("bhim,bhjm,bhijm->bhij", np.abs(pq), np.abs(phi_k), weights)
        else:
            weights = 1.0
            if spec.decay is not None:
                weights = decay_weights(spec, decay, rows, n)
            elif spec.causal:
                weights = np.tril(np.ones((n, n)))[rows]
            sim = c * weights * (pq @ np.swapaxes(phi_k, -2, -1))
            absim = c * weights * (np.abs(pq) @ np.swapaxes(np.abs(phi_k), -2, -1))
        spread = absim @ np.abs(v)
        if not spec.normalize:
            parts.append(spread)
            continue
        den = spec.eps + sim.sum(-1, keepdims=True)
        out = (sim @ v) / den
        parts.append((spread + np.abs(out) * absim.sum(-1, keepdims=True)) / np.abs(den))
    return np.concatenate(parts, axis=-2)


def make_decay(spec: Spec, shape: tuple[int, ...], rate: float, seed: int) -> torch.Tensor | None:
    """float64 gamma = exp(-rate U) per head, or log-gates -rate U (B, H, N) or (B, H, N, d),
    U ~ U[1/2, 1]: every token decays by between rate / 2 and rate."""
    if spec.decay is None:
        return None
    b, h, n, d = shape
    size = {"constant": (h,), "gates": (b, h, n), "channel-gates": (b, h, n, d)}[spec.decay]
    u = 0.5 + 0.5 * torch.rand(size, generator=torch.Generator().manual_seed(seed))
    return torch.exp(-rate * u.double()) if spec.decay == "constant" else -rate * u.double()


def scan_blocks(monkeypatch: pytest.MonkeyPatch, scan: str) -> None:
    """The causal linear form token by token ("tokens"), or in blocks of 4 beyond 8 tokens
    ("blocks": 21 tokens are five blocks and a block of one)."""
    if scan == "blocks":
        monkeypatch.setattr(golden, "SCAN_TOKENS", 8)
        monkeypatch.setattr(golden, "SCAN_BLOCK", 4)


def with_eps(specs: list[Spec]) -> list[Spec]:
    """Each spec with eps 0 and, normalised, eps 1e-6."""
    return [replace(s, eps=e) for s in specs for e in ((0.0, 1e-6) if s.normalize else (0.0,))]


# identity only unnormalised: its signed denominators are near 0 on random inputs
SCALED_SPECS = with_eps(
    [
        Spec("elu", causal=True, scale=0.3),
        Spec("elu", scale=RSQRT_D),
        Spec("relu", causal=True, normalize=False, scale=RSQRT_D),
        Spec("performer-positive", causal=True, scale=2.5),
        Spec("performer-positive", normalize=False, scale=0.3),
        Spec("identity", causal=True, normalize=False, scale=RSQRT_D),
    ]
)
DECAYED_SPECS = with_eps(
    [
        Spec("elu", causal=True, decay="constant", scale=0.3),
        Spec("identity", causal=True, normalize=False, decay="constant", scale=RSQRT_D),
        Spec("elu", causal=True, decay="gates", scale=RSQRT_D),
        Spec("performer-positive", causal=True, normalize=False, decay="gates"),
        Spec("relu", causal=True, decay="channel-gates", scale=RSQRT_D),
        Spec("identity", causal=True, normalize=False, decay="channel-gates", scale=RSQRT_D),
    ]
)
# per-token decay rates: weak; moderate; strong (factors more than 15 tokens apart underflow
# float64, a block of 4 still factored); and strong enough that a block of 4 spans more than
# FACTORED_SPAN: its channel gates weighed factor by factor
RATES = {
    "weak": 0.01,
    "moderate": 1.0,
    "underflow": 50.0,
    "pairwise": channel_gates_golden.FACTORED_SPAN,
}
# the two forms err by ~(F + N) u64 of the scale (2e-15 at most seen here); 1e-12 leaves
# the float64 prefix sums of strong decays (|G| up to ~5e3 here) |G| u64 in an exponent
FORMS_AGREE = 1e-12


def assert_forms_agree(
    spec: Spec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w, decay
) -> None:
    quad = golden_attention(q, k, v, spec, projection=w, form="quadratic", decay=decay)
    lin = golden_attention(q, k, v, spec, projection=w, form="linear", decay=decay)
    assert lin.dtype == q.dtype and lin.shape == quad.shape
    scale = error_scale(spec, f64(q), f64(k), f64(v), f64(w), f64(decay))
    assert_within(lin, f64(quad), FORMS_AGREE * scale, f"{spec} linear vs quadratic")


@pytest.mark.parametrize("scan", ["tokens", "blocks"])
@pytest.mark.parametrize("spec", SCALED_SPECS, ids=str)
def test_linear_form_matches_quadratic_form_scaled_and_unnormalised(
    spec: Spec, scan: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    scan_blocks(monkeypatch, scan)
    q, k, v, w = make_inputs(spec.feature_map, 2, 2, 21, 21, d=4, dv=3, m=6, seed=59)
    assert_forms_agree(spec, q, k, v, w, None)


@pytest.mark.parametrize("rate", list(RATES.values()), ids=list(RATES))
@pytest.mark.parametrize("scan", ["tokens", "blocks"])
@pytest.mark.parametrize("spec", DECAYED_SPECS, ids=str)
def test_linear_form_matches_quadratic_form_decayed(
    spec: Spec, scan: str, rate: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    scan_blocks(monkeypatch, scan)
    q, k, v, w = make_inputs(spec.feature_map, 2, 2, 21, 21, d=4, dv=3, m=6, seed=61)
    assert_forms_agree(spec, q, k, v, w, make_decay(spec, q.shape, rate, seed=67))


# a careful float32 scan errs by a few u32 of the scale on these inputs (the largest: 1.7)
FLOAT32_UNITS = 4.0


@pytest.mark.parametrize(
    "spec",
    [
        Spec("elu", causal=True, decay="gates", scale=RSQRT_D, eps=1e-6),
        Spec("elu", causal=True, normalize=False, decay="channel-gates", scale=RSQRT_D),
        Spec("identity", causal=True, normalize=False, decay="constant", scale=RSQRT_D),
        Spec("performer-positive", causal=True, decay="constant", scale=0.3),
    ],
    ids=str,
)
def test_float32_linear_form_is_accurate_over_many_blocks(
    spec: Spec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """N = 2048 in 32 blocks of 64, decays of memory 128 to 256 tokens: within FLOAT32_UNITS
    u32 of the scale of the float64 quadratic form on the same inputs."""
    monkeypatch.setattr(golden, "SCAN_TOKENS", 1024)
    n = 2048
    x32 = make_inputs(spec.feature_map, 1, 1, n, n, d=4, dv=2, m=6, seed=71, dtype=torch.float32)
    x32 = (*x32, make_decay(spec, x32[0].shape, 1 / 128, seed=73).float())
    q, k, v, w, decay = (None if t is None else t.double() for t in x32)
    want = golden_attention(q, k, v, spec, projection=w, form="quadratic", decay=decay)
    got = golden_attention(*x32[:3], spec, projection=x32[3], form="linear", decay=x32[4])
    scale = error_scale(spec, f64(q), f64(k), f64(v), f64(w), f64(decay))
    assert got.dtype == torch.float32
    assert_within(got, f64(want), FLOAT32_UNITS * U32 * scale, f"{spec} float32 at N = {n}")


def test_forms_of_scaled_and_decayed_specs() -> None:
    """The budgets' forms stay the quadratic one; the long-context check takes the linear
    one of every kernelised spec, which golden_attention accepts."""
    decayed = Spec("elu", causal=True, normalize=False, scale=RSQRT_D, decay="gates")
    assert golden_forms(decayed) == ("quadratic",)
    assert golden_forms(Spec("elu", scale=0.5)) == ("quadratic",)
    assert golden_forms(Spec("elu")) == GOLDEN_FORMS
    assert long_form(decayed) == long_form(Spec("taylor", normalize=False)) == "linear"
    assert long_form(Spec("softmax", causal=True)) == "quadratic"
    delta = Spec("identity", causal=True, normalize=False, delta_rule=True)
    assert long_form(delta) == golden_forms(delta)[-1]
    q, k, v, _ = make_inputs("elu", 1, 1, 3, 3, d=4, dv=2, m=1, seed=0)
    g = torch.zeros(1, 1, 3, dtype=torch.float64)
    assert golden_attention(q, k, v, decayed, form="linear", decay=g).shape == (1, 1, 3, 2)
    with pytest.raises(SpecError, match="linear"):
        golden_attention(q, k, v, Spec("softmax", causal=True), form=long_form(decayed))


# ------------------------------------------------------------------------- bad input


def test_bad_calls_raise_spec_error() -> None:
    q, k, v, _ = make_inputs("elu", 1, 1, 3, 3, d=4, dv=2, m=1, seed=0)
    w = torch.from_numpy(sample_projection(4, 4, "iid", 0))
    with pytest.raises(SpecError, match="linear"):
        golden_attention(q, k, v, Spec("softmax"), form="linear")
    with pytest.raises(SpecError, match="unknown form"):
        golden_attention(q, k, v, Spec("elu"), form="recurrent")
    with pytest.raises(SpecError, match="projection"):
        golden_attention(q, k, v, Spec("performer-positive"))
    with pytest.raises(SpecError, match="no projection"):
        golden_attention(q, k, v, Spec("elu"), projection=w)
    with pytest.raises(SpecError, match="dtype"):
        golden_attention(q, k.float(), v, Spec("elu"))
    with pytest.raises(SpecError, match="torch tensor"):
        golden_attention(q.numpy(), k, v, Spec("elu"))
    with pytest.raises(SpecError, match="Spec"):
        golden_attention(q, k, v, "elu")
    with pytest.raises(SpecError, match="causal"):
        golden_attention(q, k[:, :, :2], v[:, :, :2], Spec("elu", causal=True))


# ------------------------------------------------------------------------------ CUDA


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", NAMES)
def test_cuda_matches_naive_loop(name: str) -> None:
    spec = spec_for(name, causal=True, eps=0.1)
    for dtype, u in ((torch.float64, U64), (torch.float32, U32 + U64)):
        q, k, v, w = make_inputs(name, 2, 2, 8, 8, d=4, dv=3, m=6, seed=47, dtype=dtype)
        want, sim, absim = naive_attention(name, f64(q), f64(k), f64(v), True, 0.1, f64(w))
        units = total_units(name, f64(q), f64(k), f64(w))
        tol = u * error_bound(units, sim, absim, f64(v), want, 0.1)
        dev = [None if t is None else t.to("cuda") for t in (q, k, v, w)]
        for form in forms_for(name):
            out = golden_attention(*dev[:3], spec, projection=dev[3], form=form)
            assert out.device.type == "cuda" and out.dtype == dtype
            assert_within(out, want, tol, f"{spec} {form} cuda {dtype}")
    with pytest.raises(SpecError, match="device"):
        golden_attention(q.cuda(), k, v, Spec("elu"))
