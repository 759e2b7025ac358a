"""The delta rule's built-in forms (delta.py) and its golden recurrence (golden_delta.py)
against an independent float64 recurrence written here (_Exact), within a derived bound.

The bound (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., the standard
model fl(a op b) = (a op b)(1 + delta), |delta| <= u, and Lemma 3.1; gamma_n = n u / (1 - n u)).
Column j of the state, x_t = S_t[:, j], evolves as x_t = A_t x_(t-1) + beta_t k_t v_tj with
A_t = (I - beta_t k_t k_t^T) D_t. The keys here are unit vectors (rounded to the dtype, or
normalised inside by qk_l2norm), beta in (0, 1) and g <= 0, so ||I - beta k k^T||_2 =
max(1, |1 - beta |k|^2|) = 1 and ||D_t||_2 <= 1: A_t is non-expansive, an error made at one
token is never amplified, and |x_t| <= R_tj = |x_0| + sum_(s <= t) beta_s |k_s| |v_sj|.

One token of the recurrence: y = D x (exp within 1 ulp = 2u, a product: 3u), the dot
k^T y (gamma_d |k| |y|, Cauchy-Schwarz), v - . and beta (.) (2u), k u^T and the addition
(2u) leave a local error of at most gamma_m (|x_(t-1)| + beta_t |k_t| |v_tj|) <= gamma_m
R_tj, m = d + 8. qk_l2norm's normalisation errs by (d + 7) u / 2 per vector (the sum of
squares gamma_d, eps, sqrt or rsqrt within 2u, the product) and so moves A_t x by
2 beta |dk| |x| and beta k v by beta |dk| |v|: m = 2d + 15. Summed over the tokens (the
errors add, not multiply: (1 + gamma_m)^t - 1 <= gamma_(t m)), |x^_t - x_t| <= gamma_(t m)
R_tj, and the output o_tj = c q_t^T x_t errs by at most

    c |q_t| R_tj (gamma_(t m) + gamma_(m_out)) + u_o |o_tj| + tiny_o / 2,

m_out = d + 2 (the dot and c; + (d + 7) / 2 for q's normalisation), u_o and tiny_o the
output dtype's unit roundoff and smallest subnormal (its one final rounding). The chunked
form evaluates the same sums in another order; per chunk of C tokens it solves the unit
lower triangular system I + L by substitution, whose forward error is its backward error
times Skeel's condition number kappa of I + L (Higham, Thm. 8.5), sums over C tokens
where the recurrence sums over one, and forms its decays from prefix sums of up to C gates
(each exponent off by at most (2C + 1) u |G|, |G| the largest sum of |g| over C tokens):
we charge it m = kappa (m + C + (2C + 1) |G|), kappa the largest over every window of C
tokens (chunks start anywhere once a sequence is split) - a model of the chunked
evaluation (families/delta/bound.py's), where the recurrence's is a theorem. The test's
own float64 recurrence errs by the recurrent bound at u = 2^-53, added to the allowance.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch

from linattn_verify.families import (
    attention,
    attention_varlen,
    attention_with_state,
    fast_form,
    forms_of,
    golden_attention,
    golden_forms,
)
from linattn_verify.families.delta.fields import QK_L2NORM_EPS
from linattn_verify.families.delta.forms import delta_attention
from linattn_verify.families.delta.inputs import pack_delta
from linattn_verify.inputs import SMALLEST_SUBNORMAL, UNIT_ROUNDOFF
from linattn_verify.rounding import gamma
from linattn_verify.specs import RSQRT_D, Spec, SpecError

B, H, N, D, DV = 2, 2, 37, 8, 5  # N: no multiple of the chunk sizes 3 and 16
CHUNKS = (1, 3, 16, 64)  # 64 > N: one ragged chunk
DECAYS = (None, "gates", "channel-gates")
U64 = UNIT_ROUNDOFF["float64"]


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """One torch thread: thousands of tiny ops (a token loop, chunks of 1), which on two
    busy cores wait for thread wake-ups with two (seconds instead of one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _spec(decay, l2norm) -> Spec:
    return Spec("identity", True, normalize=False, scale=RSQRT_D, decay=decay, delta_rule=True,
                qk_l2norm=l2norm)  # fmt: skip


def _inputs(decay, l2norm, seed=0, dtype=torch.float64, n=N, batch=B):
    """q, k, v, beta, g, S_0 in `dtype`: unit keys unless normalised inside (then of norm
    about 3), beta in (0, 1), gates in [-0.5, 0]."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, H, n, D, generator=gen, dtype=torch.float64)
    k = torch.randn(batch, H, n, D, generator=gen, dtype=torch.float64)
    if not l2norm:
        k = k / k.norm(dim=-1, keepdim=True)
    v = torch.randn(batch, H, n, DV, generator=gen, dtype=torch.float64)
    beta = torch.rand(batch, H, n, generator=gen, dtype=torch.float64)
    g = None
    if decay is not None:
        shape = (batch, H, n) + ((D,) if decay == "channel-gates" else ())
        g = -0.5 * torch.rand(*shape, generator=gen, dtype=torch.float64)
    s0 = torch.randn(batch, H, D, DV, generator=gen, dtype=torch.float64)
    return [None if t is None else t.to(dtype) for t in (q, k, v, beta, g, s0)]


@dataclass
class _Exact:
    """The float64 recurrence in its matrix form, S_t = (I - beta_t k_t k_t^T) D_t S_(t-1) +
    beta_t k_t v_t^T, o_t = c S_t^T q_t, with what the bound needs: R_tj, |q_t|, and the
    (normalised) keys, beta and log-decays per channel for kappa and |G|."""

    out: np.ndarray  # (B, H, N, dv)
    state: np.ndarray  # (B, H, d, dv)
    reach: np.ndarray  # R_tj, (B, H, N, dv)
    q_norm: np.ndarray  # (B, H, N)
    k: np.ndarray
    beta: np.ndarray
    logs: np.ndarray  # (B, H, N, d)
    l2norm: bool

    @classmethod
    def of(cls, q, k, v, beta, g, s0, l2norm: bool) -> _Exact:
        q, k, v, beta = (t.double().numpy() for t in (q, k, v, beta))
        if l2norm:
            q, k = (x / np.sqrt(np.sum(x * x, -1, keepdims=True) + QK_L2NORM_EPS) for x in (q, k))
        b, h, n, d = q.shape
        logs = np.zeros((b, h, n, d)) if g is None else g.double().numpy()
        logs = np.broadcast_to(logs[..., None] if logs.ndim == 3 else logs, (b, h, n, d))
        s = np.zeros((b, h, d, v.shape[-1])) if s0 is None else s0.double().numpy()
        reach = np.linalg.norm(s, axis=-2)
        out, reaches = np.empty(v.shape), np.empty(v.shape)
        k_norm = np.linalg.norm(k, axis=-1)
        for t in range(n):
            kt, bt = k[:, :, t], beta[:, :, t, None, None]
            a = np.eye(d) - bt * kt[..., :, None] * kt[..., None, :]
            s = a @ (np.exp(logs[:, :, t, :, None]) * s) + bt * kt[..., :, None] * v[:, :, t, None]
            out[:, :, t] = d**-0.5 * np.einsum("bhm,bhmc->bhc", q[:, :, t], s)
            reach = reach + beta[:, :, t, None] * k_norm[:, :, t, None] * np.abs(v[:, :, t])
            reaches[:, :, t] = reach
        return cls(out, s, reaches, np.linalg.norm(q, axis=-1), k, beta, logs, l2norm)

    def steps(self, chunk: int | None) -> float:
        """m, the roundings charged per token: the recurrence's, or the chunked model's."""
        d = self.k.shape[-1]
        m = d + 8 + (d + 7) * self.l2norm
        if chunk is None:
            return m
        return self.kappa(chunk) * (m + chunk + (2 * chunk + 1) * self.gate_sum(chunk))

    def gate_sum(self, chunk: int) -> float:
        """|G|: the largest sum of |g| over `chunk` consecutive tokens of a channel."""
        sums = np.cumsum(np.abs(self.logs), axis=2)
        sums = np.concatenate([np.zeros_like(sums[:, :, :1]), sums], axis=2)
        width = min(chunk, sums.shape[2] - 1)
        return float(np.max(sums[:, :, width:] - sums[:, :, :-width]))

    def kappa(self, chunk: int) -> float:
        """The largest Skeel condition number || |M^-1| |M| ||_inf of M = I + L over every
        window of up to `chunk` tokens, L_ij = beta_i sum_m k_im k_jm exp(G_im - G_jm), j < i."""
        worst = 1.0
        n = self.k.shape[2]
        for start in range(n):
            part = slice(start, min(start + chunk, n))
            k, prefix = self.k[:, :, part], np.cumsum(self.logs[:, :, part], axis=2)
            size = k.shape[2]
            lower = np.tril(np.ones((size, size), dtype=bool), -1)[..., None]
            ratios = np.exp(np.where(lower, prefix[:, :, :, None] - prefix[:, :, None], -np.inf))
            gram = np.einsum("bhim,bhjm,bhijm->bhij", k, k, ratios)
            m = np.eye(size) + self.beta[:, :, part, None] * gram
            skeel = np.abs(np.linalg.inv(m)) @ np.abs(m)
            worst = max(worst, float(np.max(np.sum(skeel, -1))))
        return worst

    def allowance(self, dtype: torch.dtype, chunk: int | None = None):
        """|out - o| allowed for an output of `dtype` computed in its compute precision
        (float32 for half inputs) by the form with `chunk` (None: recurrent), and the
        allowance of the final state (module docstring)."""
        name = str(dtype).removeprefix("torch.")
        u = U64 if name == "float64" else UNIT_ROUNDOFF["float32"]
        u_out, tiny = UNIT_ROUNDOFF[name], SMALLEST_SUBNORMAL[name]
        d, n = self.k.shape[-1], self.out.shape[2]
        m, m64 = self.steps(chunk), self.steps(None)
        m_out = d + 2 + (d + 7) / 2 * self.l2norm
        t = np.arange(1, n + 1)[:, None]
        growth = np.vectorize(gamma)(t * m, u) + gamma(m_out, u)
        growth = growth + np.vectorize(gamma)(t * m64, U64) + gamma(m_out, U64)
        scale = d**-0.5 * self.q_norm[..., None] * self.reach
        out = scale * growth + u_out * (np.abs(self.out) + scale * growth) + tiny / 2
        state = (gamma(n * m, u) + gamma(n * m64, U64)) * self.reach[:, :, -1, None, :]
        return out, state


def _assert_within(got: torch.Tensor, want: np.ndarray, allowed: np.ndarray, what: str):
    assert np.all(np.isfinite(allowed)), f"{what}: the bound is vacuous (n u >= 1)"
    err = np.abs(got.double().numpy() - want)
    worst = np.unravel_index(np.argmax(err / allowed), err.shape)
    assert np.all(err <= allowed), (
        f"{what}: |error| {err[worst]:.3g} > allowed {allowed[worst]:.3g} at {worst}"
    )


def _kwargs(decay, l2norm, beta, g, form, chunk):
    return dict(feature_map="identity", normalize=False, scale=RSQRT_D,
                decay=decay, delta_rule=True, qk_l2norm=l2norm, beta=beta, g=g, form=form,
                chunk_size=chunk)  # fmt: skip


def _causal(fn, *args, **kwargs):
    """attention or attention_varlen of a causal spec (attention_with_state is causal)."""
    return fn(*args, causal=True, **kwargs)


def _forms():
    return [("recurrent", None)] + [("chunked", c) for c in CHUNKS]


@pytest.mark.parametrize("initial", [False, True], ids=["zero", "state"])
@pytest.mark.parametrize("l2norm", [False, True], ids=["unit-k", "l2norm"])
@pytest.mark.parametrize("decay", DECAYS)
def test_each_form_is_the_recurrence_in_float64(decay, l2norm, initial):
    q, k, v, beta, g, s0 = _inputs(decay, l2norm)
    s0 = s0 if initial else None
    exact = _Exact.of(q, k, v, beta, g, s0, l2norm)
    for form, chunk in _forms():
        out, state = attention_with_state(
            q, k, v, initial_state=s0, **_kwargs(decay, l2norm, beta, g, form, chunk or 64)
        )
        allowed, allowed_state = exact.allowance(torch.float64, chunk)
        assert out.dtype == torch.float64 and state.shape == (B, H, D, DV)
        _assert_within(out, exact.out, allowed, f"{form} {chunk}")
        _assert_within(state, exact.state, np.broadcast_to(allowed_state, state.shape), "state")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("decay", DECAYS)
def test_half_and_single_inputs_give_their_dtype_within_the_float32_bound(decay, dtype):
    q, k, v, beta, g, s0 = _inputs(decay, True, seed=1, dtype=dtype)
    exact = _Exact.of(q, k, v, beta, g, s0, True)
    for form, chunk in (("recurrent", None), ("chunked", 16)):
        kw = _kwargs(decay, True, beta, g, form, chunk or 64)
        out, state = attention_with_state(q, k, v, initial_state=s0, **kw)
        assert out.dtype == dtype and state.dtype == torch.float32
        allowed, allowed_state = exact.allowance(dtype, chunk)
        _assert_within(out, exact.out, allowed, f"{form} {dtype}")
        _assert_within(state, exact.state, np.broadcast_to(allowed_state, state.shape), "state")
        fresh = attention_with_state(q, k, v, **kw)[0]
        assert torch.equal(_causal(attention, q, k, v, **kw), fresh)


@pytest.mark.parametrize("decay", DECAYS)
def test_the_state_carried_from_the_first_half_continues_it(decay):
    q, k, v, beta, g, s0 = _inputs(decay, False, seed=2)
    exact = _Exact.of(q, k, v, beta, g, s0, False)
    half = N // 2
    for form, chunk in (("recurrent", None), ("chunked", 3), ("chunked", 16)):
        parts, state = [], s0
        for rows in (slice(0, half), slice(half, N)):
            piece = [t[:, :, rows] for t in (q, k, v, beta)]
            kw = _kwargs(decay, False, piece[3], None if g is None else g[:, :, rows], form,
                         chunk or 64)  # fmt: skip
            out, state = attention_with_state(*piece[:3], initial_state=state, **kw)
            parts.append(out)
        allowed, allowed_state = exact.allowance(torch.float64, chunk)
        _assert_within(torch.cat(parts, dim=2), exact.out, allowed, f"{form} {chunk} in halves")
        _assert_within(state, exact.state, np.broadcast_to(allowed_state, state.shape), "state")


@pytest.mark.parametrize("decay", DECAYS)
def test_a_packed_batch_is_each_sequence_by_itself(decay):
    offsets = [0, 5, 5, 6, 20, N]  # an empty sequence, one of one token
    cu = torch.tensor(offsets)
    q, k, v, beta, g, _ = _inputs(decay, True, seed=3, batch=1)
    starts = torch.randn(len(offsets) - 1, H, D, DV, dtype=torch.float64)
    for form, chunk in (("recurrent", None), ("chunked", 3)):
        kw = _kwargs(decay, True, beta, g, form, chunk or 64)
        packed = _causal(attention_varlen, q, k, v, cu, **kw)
        spec, c = _spec(decay, True), chunk or 64
        with_states, finals = delta_attention(q, k, v, spec, form, beta, g, c, starts, cu)
        for s, (a, b) in enumerate(itertools.pairwise(offsets)):
            if b == a:
                assert torch.equal(finals[s], starts[s])  # an empty sequence keeps its state
                continue
            piece = [None if t is None else t[:, :, a:b] for t in (q, k, v, beta, g)]
            own = _causal(attention, *piece[:3], **(kw | {"beta": piece[3], "g": piece[4]}))
            assert torch.equal(packed[:, :, a:b], own), f"{form}: sequence {s} alone differs"
            for s0, got in ((None, packed), (starts[s : s + 1], with_states)):
                exact = _Exact.of(*piece, s0, True)
                allowed, allowed_state = exact.allowance(torch.float64, chunk)
                _assert_within(got[:, :, a:b], exact.out, allowed, f"{form} sequence {s}")
            final = finals[s : s + 1]
            _assert_within(final, exact.state, np.broadcast_to(allowed_state, final.shape), "S")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
@pytest.mark.parametrize("l2norm", [False, True], ids=["unit-k", "l2norm"])
@pytest.mark.parametrize("decay", DECAYS)
def test_the_golden_recurrence_is_the_recurrence_and_the_forms(decay, l2norm, dtype):
    q, k, v, beta, g, _ = _inputs(decay, l2norm, seed=4, dtype=dtype)
    spec = _spec(decay, l2norm)
    assert golden_forms(spec) == ("recurrent",)
    assert forms_of(spec) == ("recurrent", "chunked") and fast_form(spec) == "chunked"
    golden = golden_attention(q, k, v, spec, None, "recurrent", pack_delta(beta, g))
    assert golden.dtype == dtype
    exact = _Exact.of(q, k, v, beta, g, None, l2norm)
    allowed, _ = exact.allowance(dtype)
    _assert_within(golden, exact.out, allowed, "golden")
    fast = _causal(attention, q, k, v, **_kwargs(decay, l2norm, beta, g, None, 16))
    both = allowed + exact.allowance(dtype, 16)[0]  # each within its own of the exact
    _assert_within(fast, golden.double().numpy(), both, "the chunked form against the golden")


def test_bad_delta_rule_inputs_are_one_line_spec_errors():
    q, k, v, beta, g, s0 = _inputs("gates", False, n=6)
    kw = _kwargs("gates", False, beta, g, "chunked", 4)
    bad = {
        "beta": [({"beta": None}, "needs beta"), ({"beta": beta[..., :3]}, "beta must have")],
        "non-finite": [({"beta": beta.clone().fill_(math.nan)}, "non-finite")],
        "gates": [({"g": -g}, "must be <= 0"), ({"g": g[..., :2]}, "must have shape")],
        "form": [({"form": "quadratic"}, "unknown form"), ({"chunk_size": 0}, "chunk_size")],
        "spec": [({"normalize": True}, "unnormalised"), ({"gamma": beta[0, :, 0]}, "not gamma")],
    }
    for change, message in itertools.chain(*bad.values()):
        with pytest.raises(SpecError, match=message) as info:
            _causal(attention, q, k, v, **(kw | change))
        assert "\n" not in str(info.value)
    with pytest.raises(SpecError, match="initial_state must be S"):
        attention_with_state(q, k, v, initial_state=s0[..., :2], **kw)
    with pytest.raises(SpecError, match="delta rule"):
        attention(q, k, v, "identity", True, beta=beta)
    with pytest.raises(SpecError, match="packed"):
        golden_attention(q, k, v, _spec("gates", False), decay=beta)


@pytest.mark.parametrize("decay", DECAYS)
def test_grouped_value_heads_read_query_head_hv_over_g(decay):
    """q and k of H heads with v, beta, g of 2 H (fla's grouped value heads): each form
    gives exactly its output for q and k repeated so that value head hv has head hv // 2,
    and the spec declares the grouping in one line or names what is wrong."""
    q, k, v, beta, g, s0 = _inputs(decay, False, seed=5)
    few = [t[:, ::2] for t in (q, k)]  # H / 2 query and key heads
    wide = [t.repeat_interleave(2, dim=1) for t in few]
    for form, chunk in (("recurrent", None), ("chunked", 16)):
        kw = _kwargs(decay, False, beta, g, form, chunk or 64)
        grouped = attention_with_state(*few, v, initial_state=s0, **kw)
        expanded = attention_with_state(*wide, v, initial_state=s0, **kw)
        assert all(torch.equal(a, b) for a, b in zip(grouped, expanded, strict=True)), form
    assert "value-heads=2" in str(replace(_spec(decay, False), value_heads=2))
    for bad in (0, True, 1.5):
        with pytest.raises(SpecError, match="value_heads must be an integer >= 1"):
            replace(_spec(decay, False), value_heads=bad)
    with pytest.raises(SpecError, match=r"value_heads \(--value-heads\) is for the delta rule"):
        Spec("identity", True, normalize=False, value_heads=2)
