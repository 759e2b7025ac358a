"""The third-party adapters: each loads, takes its declared layout and returns the right
shape and dtype; missing CUDA fails cleanly; the delta rule's agree with a float64
recurrence within a floating-point bound. Judging their numbers is vet's job
(tests/test_adapter_verdicts.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from linattn_verify.adapters import ADAPTERS, Adapter, AdapterUnavailable
from linattn_verify.cases import Case
from linattn_verify.families import case_arguments, family_of
from linattn_verify.families.delta.fields import QK_L2NORM_EPS
from linattn_verify.families.delta.inputs import pack_delta
from linattn_verify.inputs import UNIT_ROUNDOFF
from linattn_verify.under_test import ImplementationFailure, resolve

B, H, N, D, DV, M = 2, 2, 5, 4, 3, 8
# (adapter, dtype) pairs the library itself does not support, and adapters that do not
# take d != dv (the inputs here have d = 4, dv = 3)
_RESHAPE = "the output is reshaped to q's shape: d != dv raises"
LIBRARY_LIMITS = {
    **{
        (name, torch.float64): "fla's chunk_fwd_kernel_o takes a float64 tl.dot into a float32 "
        "accumulator and stores the result through a float64 pointer: it does not compile"
        for name in (
            "fla.linear-attn-chunk",
            "fla.simple-gla-chunk",
            "fla.simple-gla-chunk-gamma",
            "fla.retention-chunk",
            "fla.retention-parallel",
        )
    },
    ("fla.gla-chunk", torch.float64): "fla's chunk_gla_fwd_kernel_o does the same (a float64 "
    "tl.dot into a float32 accumulator, stored through a float64 pointer)",
    ("fla.iplr-chunk", torch.float64): "fla's chunk_generalized_iplr_delta_rule_fwd_kernel_o "
    "does the same (a float64 tl.dot into a float32 accumulator, stored through a float64 "
    "pointer)",
    ("fla.iplr-naive", torch.float64): "fla's iplr_recurrence casts q, k, v and beta to float32, "
    "not alpha: the state turns float64 and a float32 einsum refuses it",
    **{
        (f"fla.{name}{l2norm}", dtype): reason
        for l2norm in ("", "-l2norm")
        for name, dtype, reason in (
            ("delta-rule-chunk", torch.float32, "chunk_delta_rule asserts q.dtype != float32"),
            (
                "delta-rule-chunk",
                torch.float64,
                "fla's merge_16x16_to_64x64_inverse_kernel casts float32 to float64 with "
                "fp_downcast_rounding, which Triton refuses",
            ),
            (
                "gated-delta-rule-chunk",
                torch.float64,
                "fla's chunk_gated_delta_rule_fwd_kkt_solve_kernel mixes float64 and float32 "
                "blocks in tl.dot",
            ),
            (
                "kda-chunk",
                torch.float64,
                "fla's chunk_gla_fwd_kernel_o, as fla.gla-chunk's (a float64 tl.dot into a "
                "float32 accumulator, stored through a float64 pointer)",
            ),
        )
    },
    **{
        (name, torch.float64): "fast_transformers' causal_product CPU kernel is float32-only"
        for name in (
            "fast-transformers.causal-linear",
            "taylor-series-linear-attention.taylor-series-linear-attn-causal",
        )
    },
    **{
        (f"linear-attention-transformer.{name}", dtype): _RESHAPE
        for name in ("linear-attn", "causal-linear-attn", "causal-linear-attn-bucket1")
        for dtype in (torch.float32, torch.float64)
    },
}


def inputs(adapter: Adapter, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """q, k (B, H, N, d), v (B, H, N, dv) and W (m, d), on the adapter's device."""
    gen = torch.Generator().manual_seed(seed)
    shapes = ((B, H, N, D), (B, H, N, D), (B, H, N, DV), (M, D))
    device = "cuda" if adapter.triton and torch.cuda.is_available() else "cpu"
    return tuple(torch.randn(s, generator=gen, dtype=dtype).to(device) for s in shapes)


def implementation(adapter: Adapter, **claim):
    """The adapter as an Implementation (with the options `claim`), or a skip naming what is
    missing."""
    try:
        return resolve(adapter.name, **claim)
    except AdapterUnavailable as err:
        pytest.skip(str(err))


# outputs in another dtype than the inputs' (the contract check's finding on them)
DTYPE_LIMITS = {
    (f"fla.{name}", torch.float64): "its output stays float32"
    for name in (
        "simple-gla-naive",
        "simple-gla-naive-chunk",
        "gated-delta-rule-naive",
        "gated-delta-rule-naive-chunk",
    )
}


def cases():
    for name in ADAPTERS:
        for dtype in (torch.float32, torch.float64):
            marks = []
            if limit := LIBRARY_LIMITS.get((name, dtype)):
                marks = [pytest.mark.xfail(reason=limit, raises=ImplementationFailure)]
            if limit := DTYPE_LIMITS.get((name, dtype)):
                marks = [pytest.mark.xfail(reason=limit, raises=AssertionError, strict=True)]
            if ADAPTERS[name].triton and family_of(ADAPTERS[name].spec).stepwise:  # seconds each
                marks.append(pytest.mark.all_variants)
            yield pytest.param(name, dtype, marks=marks, id=f"{name}-{str(dtype)[6:]}")


@pytest.mark.parametrize(("name", "dtype"), list(cases()))
def test_adapter_shape_and_dtype(name: str, dtype: torch.dtype) -> None:
    """Through the Implementation wrapper, which puts the inputs in the adapter's layout and
    raises ImplementationFailure on a wrong shape."""
    impl = implementation(ADAPTERS[name])
    q, k, v, w = inputs(ADAPTERS[name], dtype)
    out = impl(q, k, v, w, case_arguments(Case(B, H, N, D, DV, str(dtype)[6:]), impl.spec)[-1])
    assert tuple(out.shape) == (B, H, N, DV)
    assert out.dtype == dtype
    assert out.device == q.device


# The delta rule's smoke test: B = 1, H = 2, N tokens, d = 4, dv = 3
DELTA_SHAPE = (1, 2, 9, 4, 3)
# The dtype each is called in: float64 unless the function refuses it (LIBRARY_LIMITS)
DELTA_DTYPES = {
    **{f"fla.delta-rule-chunk{x}": torch.float16 for x in ("", "-l2norm")},
    **{
        f"fla.{n}-chunk{x}": torch.float32
        for n in ("gated-delta-rule", "kda")
        for x in ("", "-l2norm")
    },
}
# The precision each computes in: float32 (casts, float32 state and accumulators) unless listed
DELTA_WORKING = {
    "fla.delta-rule-naive-chunk": "float64",  # the input dtype, float64 here
    # its w, u, chunk states and v_new stored in the input dtype, float16 here
    **{f"fla.delta-rule-chunk{x}": "float16" for x in ("", "-l2norm")},
}


def delta_recurrence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None,
    s0: torch.Tensor,
    l2norm: bool,
) -> tuple[torch.Tensor, ...]:
    """The delta rule in float64 on (B, H, N, .) tensors, literally: S <- D_t S (D_t =
    exp(g_t), a scalar or diag per key channel); u = beta_t (v_t - S^T k_t); S <- S + k_t
    u^T; o_t = c S^T q_t, c = d^-0.5; q and k first x / sqrt(|x|^2 + eps) with `l2norm`.
    Returns (o, final S, M = max_t (|S_(t-1)|_F + |v_t|) per (batch, head), max_t |q_t|)."""
    if l2norm:
        q, k = (x / (x.square().sum(-1, keepdim=True) + QK_L2NORM_EPS).sqrt() for x in (q, k))
    s = s0.clone()
    out, sizes = torch.zeros(*q.shape[:3], v.shape[-1], dtype=torch.float64), []
    for t in range(q.shape[2]):
        sizes.append(torch.linalg.matrix_norm(s) + torch.linalg.vector_norm(v[:, :, t], dim=-1))
        if g is not None:
            s = s * (g[:, :, t, :, None] if g.dim() == 4 else g[:, :, t, None, None]).exp()
        kt = k[:, :, t]
        u = beta[:, :, t, None] * (v[:, :, t] - torch.einsum("bhkv,bhk->bhv", s, kt))
        s = s + kt[..., :, None] * u[..., None, :]
        out[:, :, t] = q.shape[-1] ** -0.5 * torch.einsum("bhkv,bhk->bhv", s, q[:, :, t])
    q_max = torch.linalg.vector_norm(q, dim=-1).amax(-1)
    return out, s, torch.stack(sizes, -1).amax(-1), q_max


def delta_bounds(
    u: float, n: int, d: int, chunk: int, l2norm: bool, size: torch.Tensor, q_max: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A-priori bounds on max |out - ref| and max |S - S_ref| for the delta rule computed in
    unit roundoff u over n tokens (Higham, gamma_m = m u / (1 - m u)), normwise:

    - one token's update is the exact update of the step's inputs plus a local error <=
      gamma_m_t (|S_(t-1)|_F + |v_t|) (|k_t| <= 1, beta <= 1, |D_t| <= 1), m_t counting
      the roundings: k (twice: it projects and it writes), v, beta and g rounded to the
      working precision (5), exp(g) (2) and D S (1), S^T k (d), v - ., beta ., k u^T and
      S + . (4): m_t = d + 12; a chunked form sums up to `chunk` terms more per entry
      (+ chunk); q and k normalised inside (l2norm: |x|^2, + eps, sqrt, /) cost d + 3 each
      time k enters (+ 2 (d + 3));
    - the exact map S -> (I - beta_t k_t k_t^T) D_t S is non-expansive (the eigenvalues of
      I - beta k k^T are 1 and 1 - beta |k|^2, in [-1, 1] for beta |k|^2 <= 2), so the
      local errors add without growing, with S_0 rounded once: |S - S_ref|_F <=
      gamma_(n m_t + 1) M, M = max_t (|S_(t-1)|_F + |v_t|);
    - o_t = c S_t^T q_t adds q's rounding, S^T q (d, + chunk), c . and the output's
      rounding (+ d + 3 with l2norm): |o_t - ref_t| <= c |q_t| gamma_(n m_t + d + chunk
      + 4) M.

    A chunked form's triangular solve, (I + strictly lower diag(beta) K K^T)^-1, is taken as
    well conditioned (random unit keys at n = 9; its ill-conditioned case, nearly parallel
    keys, is the checks' concern). Per (batch, head), as `size` and `q_max` are."""
    normalise = d + 3 if l2norm else 0
    m_state = n * (d + chunk + 12 + 2 * normalise) + 1
    m_out = m_state + d + chunk + 3 + normalise

    def gamma(m: int) -> float:
        assert m * u < 1, f"gamma_{m} needs m u < 1 (u = {u})"
        return m * u / (1 - m * u)

    return d**-0.5 * q_max * gamma(m_out) * size, gamma(m_state) * size


def delta_adapters():
    """The delta rule's adapters; the Triton ones (seconds each in the interpreter) marked
    all_variants, as the Triton variants of test_adapter_verdicts.py."""
    for name, adapter in ADAPTERS.items():
        if adapter.spec.delta_rule:
            marks = [pytest.mark.all_variants] if adapter.triton else []
            yield pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", list(delta_adapters()))
def test_a_delta_rule_adapter_agrees_with_a_float64_recurrence(name: str) -> None:
    """Through the Implementation (beta and gates unpacked, the layout and the state's
    checked): output and final state, continuing from an initial state where the adapter
    carries one, within delta_bounds of the float64 recurrence on the same rounded
    inputs. Unit-norm keys (raw ones for a kernel that normalises them), beta ~ U(0, 1),
    log-gates ~ -U(0, 1/2)."""
    adapter = ADAPTERS[name]
    spec, dtype = adapter.spec, DELTA_DTYPES.get(name, torch.float64)
    impl = implementation(adapter, **({"state": adapter.state} if adapter.state else {}))
    b, h, n, d, dv = DELTA_SHAPE
    gen = torch.Generator().manual_seed(7)
    q, k = (torch.randn(b, h, n, d, generator=gen, dtype=torch.float64) for _ in range(2))
    if not spec.qk_l2norm:
        k = k / torch.linalg.vector_norm(k, dim=-1, keepdim=True)
    v = torch.randn(b, h, n, dv, generator=gen, dtype=torch.float64)
    beta = torch.rand(b, h, n, generator=gen, dtype=torch.float64)
    gates = {None: None, "gates": (b, h, n), "channel-gates": (b, h, n, d)}[spec.decay]
    g = None if gates is None else -torch.rand(gates, generator=gen, dtype=torch.float64) / 2
    s0 = torch.randn(b, h, d, dv, generator=gen, dtype=torch.float64) / 2
    # the inputs rounded to the dtype once; the reference computes from exactly those
    q, k, v, beta, s0 = (t.to(dtype) for t in (q, k, v, beta, s0))
    g = None if g is None else g.to(dtype)
    packed = pack_delta(beta, g)
    if impl.state is None:
        s0 = torch.zeros_like(s0)
        out, final = impl(q, k, v, None, packed), None
    else:
        out, final = impl.call_state(q, k, v, None, s0, decay=packed)
    f64 = [None if t is None else t.double() for t in (q, k, v, beta, g, s0)]
    ref, s_ref, size, q_max = delta_recurrence(*f64, spec.qk_l2norm)
    chunk = n if "chunk" in name else 1  # a chunked form: at most n tokens a chunk
    u = UNIT_ROUNDOFF[DELTA_WORKING.get(name, "float32")]
    out_bound, state_bound = delta_bounds(u, n, d, chunk, spec.qk_l2norm, size, q_max)
    out_error = (out.double() - ref).abs().amax((-2, -1))
    assert (out_error <= out_bound).all(), f"{name}: output off by {out_error} > {out_bound}"
    if final is not None:
        state_error = (final.double() - s_ref).abs().amax((-2, -1))
        assert (state_error <= state_bound).all(), (
            f"{name}: final state off by {state_error} > {state_bound}"
        )


def test_adapter_declarations() -> None:
    for name, adapter in ADAPTERS.items():
        assert adapter.name == name
        assert adapter.layout in ("bhnd", "bnhd")
        assert adapter.cost in ("linear", "quadratic")
        assert adapter.note and adapter.function and adapter.library


def test_fla_naive_files_load_without_importing_fla() -> None:
    """The naive.py files run on their own: fla/__init__.py (Triton) is never executed."""
    pytest.importorskip("einops")
    implementation(ADAPTERS["fla.linear-attn-naive"])  # skips when fla is not installed
    code = (
        "import sys; from linattn_verify.under_test import resolve; "
        "resolve('fla.linear-attn-naive'); resolve('fla.based-naive'); resolve('fla.gla-naive'); "
        "resolve('fla.delta-rule-naive'); resolve('fla.gated-delta-rule-naive'); "
        "resolve('fla.kda-naive'); "
        "assert 'fla' not in sys.modules, sorted(m for m in sys.modules if m.startswith('fla'))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_a_triton_adapter_runs_in_the_interpreter_without_cuda() -> None:
    """Said in the command that reruns it, so that a GPU machine runs what ran here."""
    for name in (n for n, a in ADAPTERS.items() if a.triton):
        impl = resolve(name, load=False)
        assert impl.triton == "interpret" and "--triton interpret" in impl.command
