"""Triton's interpreter as the suite runs it (linattn_verify/triton_interpret.py): each shim does
what a GPU does where the bare interpreter does not, and the guard bands
(under_test/guard_bands.py) name the tensor a kernel reads or writes past."""

from __future__ import annotations

import inspect
import json
import shlex
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

import triton
import triton.language as tl

from linattn_verify import triton_interpret
from linattn_verify.under_test.guard_bands import OutOfBounds, guarded
from tests.zoo import triton_kernels as zoo


@triton.jit
def _dot_and_loop(a, b, o, o_ieee, bf, bf_out, n, B: tl.constexpr):
    r = tl.arange(0, B)
    at = tl.load(a + r[:, None] * B + r[None, :])
    bt = tl.load(b + r[:, None] * B + r[None, :])
    tl.store(o + r[:, None] * B + r[None, :], tl.dot(at, bt))
    tl.store(o_ieee + r[:, None] * B + r[None, :], tl.dot(at, bt, input_precision="ieee"))
    total = tl.zeros([B], dtype=tl.float32)
    for i in range(n):  # i.to(): a tensor, as in compiled code
        total += tl.load(bf + i.to(tl.int64) * B + r).to(tl.float32)
    tl.store(bf_out + r, (total * 3.0).to(tl.bfloat16))


@triton.jit
def _float64_dot_into_float32(x, o, B: tl.constexpr):
    r = tl.arange(0, B)
    a = tl.load(x + r[:, None] * B + r[None, :])
    acc = tl.dot(a, a, tl.zeros([B, B], dtype=tl.float32))  # typed float64, float32 inside
    p_o = o + r[:, None] * B + r[None, :]
    tl.store(p_o, acc.to(p_o.dtype.element_ty))


@triton.jit
def _integer_types(o, n):
    """The bit widths of loop variables and of builtin min/max, as compiled code types them."""
    wide = tl.program_id(0).to(tl.int64) + n
    for i in range(n):
        tl.store(o + 0, i.dtype.primitive_bitwidth)
    for i in range(0, wide):
        tl.store(o + 1, i.dtype.primitive_bitwidth)
    tl.store(o + 2, min(wide, n).dtype.primitive_bitwidth)
    tl.store(o + 3, max(n, wide).dtype.primitive_bitwidth)
    tl.store(o + 4, min(n, n + 1).dtype.primitive_bitwidth)


def test_loop_variables_and_builtin_min_max_have_the_compilers_integer_types():
    """A loop over int64 bounds has an int64 variable, min(int64, int32) is int64 (tl.minimum's
    promotion), where the bare interpreter gives int32 and the int32 operand itself."""
    o = torch.zeros(5, dtype=torch.int32)
    _integer_types[(1,)](o, 2)
    assert o.tolist() == [32, 64, 64, 64, 32]


def test_a_store_of_another_float_type_raises_as_compiling_it_does():
    """The bare interpreter writes the float32 bytes into the float64 output: garbage."""
    x, o = torch.eye(16, dtype=torch.float64), torch.zeros(16, 16, dtype=torch.float64)
    with pytest.raises(Exception, match="fp32 value through a pointer to fp64"):
        _float64_dot_into_float32[(1,)](x, o, B=16)


def _run(tf32: bool):
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(16, 16, generator=gen) for _ in range(2))
    bf = torch.randn(3, 16, generator=gen).bfloat16()
    o, o_ieee, out = torch.empty(16, 16), torch.empty(16, 16), torch.empty(16).bfloat16()
    with triton_interpret.running(tf32):
        _dot_and_loop[(1,)](a, b, o, o_ieee, bf, out, 3, B=16)
    return a, b, o, o_ieee, bf, out


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """x rounded to 10 mantissa bits, to nearest even (what TF32 tensor cores take)."""
    bits = x.view(torch.int32)
    rounded = (bits + 0xFFF + ((bits >> 13) & 1)) & ~0x1FFF
    return rounded.view(torch.float32)


def test_float32_products_are_ieee_unless_tf32_is_asked_for():
    a, b, o, o_ieee, *_ = _run(tf32=False)
    exact = a.double() @ b.double()
    assert (o.double() - exact).abs().max() < 1e-5
    a, b, o, o_ieee, *_ = _run(tf32=True)
    assert torch.allclose(o.double(), _tf32(a).double() @ _tf32(b).double(), rtol=0, atol=1e-5)
    assert (o.double() - exact).abs().max() > 1e-4  # TF32's 2^-11 per product shows
    assert (o_ieee.double() - exact).abs().max() < 1e-5  # input_precision="ieee" is left alone


def test_bfloat16_is_rounded_to_nearest_even_not_summed_as_bits():
    *_, bf, out = _run(tf32=False)
    expected = (bf.float().sum(0) * 3.0).bfloat16()  # torch rounds float32 to nearest even
    assert torch.equal(out, expected)


def test_numpy_types_looked_up_by_name_are_tritons_but_bfloat16s():
    """The shim's cache of a plain dtype's numpy type by its name: triton's own type for each,
    float32 for bfloat16 (its values carried as numbers), pointers and blocks as before."""
    from triton.runtime import interpreter

    ours, theirs = interpreter._get_np_dtype, interpreter._get_np_dtype.__wrapped__
    known = [tl.dtype(n) for n in ("int1", "int8", "int32", "uint64", "fp16", "fp32", "fp64")]
    for ty in [*known, tl.pointer_type(tl.float32), tl.block_type(tl.float16, [4])] * 2:
        assert ours(ty) == theirs(ty), ty
    assert ours(tl.dtype("bf16")) == ours(tl.bfloat16) == np.float32


def test_the_autotuner_runs_the_chosen_config_and_names_it():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 1, 40, 4, generator=gen) for _ in range(3))
    exact = (q.double() @ k.double().transpose(-1, -2)).tril() @ v.double()
    errors = {}
    for variant in (0, 1):
        with triton_interpret.use_config(variant):
            errors[variant] = float((zoo.triton_state_of_16_rows(q, k, v) - exact).abs().max())
    # every autotuned kernel this process has run is named, fla's too when tests ran them
    assert "_chunk_kernel BT=16" in triton_interpret.describe(0).split("; ")
    assert "_chunk_kernel BT=32" in triton_interpret.describe(1).split("; ")
    assert errors[0] < 1e-5 < 1 < errors[1]  # its bug is BT = 32's alone


@triton.jit
def _twice(x):
    return x * 2.0


@triton.jit
def _calls_a_jit_function(x, o, B: tl.constexpr):
    r = tl.arange(0, B)
    for i in range(3):
        tl.store(o + i * B + r, _twice(tl.load(x + i * B + r)))


def test_a_launch_patches_triton_language_once_and_restores_it(monkeypatch):
    """The @jit function a kernel calls in a loop does not walk triton.language again on each
    call (_patch_once), and triton.language has its builtins back after the launch."""
    from triton.runtime import interpreter

    walked = []
    walk = interpreter._patch_builtin
    monkeypatch.setattr(interpreter, "_patch_builtin", lambda *a: walked.append(a[0]) or walk(*a))
    x, o = torch.randn(3, 16), torch.empty(3, 16)
    _calls_a_jit_function[(1,)](x, o, B=16)
    assert walked.count(tl) == 1  # the launch's: three calls of _twice, no walk of their own
    assert torch.equal(o, x * 2.0)
    assert tl.core.is_builtin(tl.load) and tl.core.is_builtin(tl.tensor.__add__)


def test_patching_once_a_launch_computes_what_patching_every_call_does(monkeypatch):
    """The zoo's chunk kernel (autotuned, a loop, tl.dot, a @jit helper called per block):
    the same bits with triton's own _patch_lang, which patches on every call."""
    from triton.runtime import interpreter

    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 37, 4, generator=gen) for _ in range(3))
    once = zoo.triton_chunked(q, k, v)
    monkeypatch.setattr(interpreter, "_patch_lang", interpreter._patch_lang.__wrapped__)
    assert torch.equal(once, zoo.triton_chunked(q, k, v))


def test_guard_bands_name_what_is_read_past_or_left_unwritten():
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 37, 4, generator=gen) for _ in range(3))
    assert torch.isfinite(guarded(zoo.triton_chunked)(q, k, v)).all()
    with pytest.raises(OutOfBounds, match=r"reads past the end of v: NaN in the output at \(0, "):
        guarded(zoo.triton_unmasked_last_block)(q, k, v)
    with pytest.raises(OutOfBounds, match="from memory it allocated and never wrote"):
        guarded(zoo.triton_last_block_skipped)(q, k, v)


def test_guard_bands_see_writes_past_the_end():
    def spill(q, k, v):
        out = torch.empty_like(v)
        out.as_strided((out.numel() + 1,), (1,)).fill_(1.0)  # one element past the end
        return out

    past = r"writes past the end of a buffer of shape \(1, 1, 3, 2\)"
    with pytest.raises(OutOfBounds, match=past):
        guarded(spill)(*(torch.ones(1, 1, 3, 2) for _ in range(3)))


def test_another_triton_version_is_refused_in_one_line():
    code = (
        "import triton; triton.__version__ = '3.1.0'\n"
        "from linattn_verify.cli import main\n"
        "raise SystemExit(main(['check', 'contract', '--impl', "
        "'tests.zoo.triton_kernels:triton_chunked', '--feature-map', 'identity', '--causal', "
        "'--no-normalize', '--triton', 'interpret']))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "triton 3.1.0 is installed" in lines[0], run.stderr


def test_tf32_products_are_found_over_float32s_budget_and_pass_when_declared():
    from linattn_verify.cases import Case
    from linattn_verify.checks import CHECKS
    from linattn_verify.under_test import resolve
    from linattn_verify.vet.causes import name_cause

    case = Case(2, 2, 33, 8, 4, "float32", "normal", 1.0, 3, None, "cpu")
    claim = {"feature_map": "identity", "causal": True, "normalize": False, "triton": "interpret"}
    ieee = CHECKS["reference"](resolve(zoo.triton_chunked, **claim), case)
    assert ieee.passed, ieee.message
    tf32 = resolve(zoo.triton_chunked, tf32=True, **claim)
    found = CHECKS["reference"](tf32, case)
    assert not found.passed
    cause = name_cause(found.to_dict(), tf32.spec)
    assert cause is not None and cause.key == "tf32-products", found.message
    assert cause.advice == ("--dot-precision", "tf32")
    # on CUDA no tl.dot is counted: the same size is said to have two explanations, no flag
    row = found.to_dict()
    row["case"] = row["case"].replace('"device":"cpu"', '"device":"cuda"')
    row["figures"] = {k: v for k, v in row["figures"].items() if k != "tf32_dots"}
    cuda = name_cause(row, tf32.spec)
    assert cuda is not None and cuda.advice == () and "no experiment here tells" in cuda.detail
    declared = resolve(zoo.triton_chunked, tf32=True, dot_precision="tf32", **claim)
    restored = CHECKS["reference"](declared, case)
    assert restored.passed and "tf32 products" in restored.message, restored.message


def test_the_long_context_failure_of_tf32_products_is_their_finding():
    """Issue 51, item 3: at length, the failure TF32 products make passes with IEEE ones
    (the same length rerun), so it is listed under the tf32-products finding, not beside it."""
    from linattn_verify.under_test import resolve
    from linattn_verify.vet.runner import VetOptions, vet_in_process

    claim = {"feature_map": "identity", "causal": True, "normalize": False, "triton": "interpret"}
    impl = resolve(zoo.triton_chunked, tf32=True, **claim)
    options = VetOptions(dtypes=("float32",), smallest=True, longest=1024, envelope=False)
    (finding,) = vet_in_process(impl, options).findings
    assert finding.cause == "tf32-products" and "long-context" in finding.checks


@triton.jit
def _half_state_kernel(q, k, v, o, T, K: tl.constexpr, V: tl.constexpr):
    """Causal identity attention token by token, products elementwise (no tl.dot), its
    state S (K, V) kept in float16 whatever the inputs' dtype: a bug that errs by 2^-11."""
    i_bh, rk, rv = tl.program_id(0), tl.arange(0, K), tl.arange(0, V)
    state = tl.zeros([K, V], dtype=tl.float16)
    for t in range(T):
        b_q = tl.load(q + (i_bh * T + t) * K + rk).to(tl.float32)
        b_k = tl.load(k + (i_bh * T + t) * K + rk).to(tl.float32)
        b_v = tl.load(v + (i_bh * T + t) * V + rv).to(tl.float32)
        state = (state.to(tl.float32) + b_k[:, None] * b_v[None, :]).to(tl.float16)
        b_o = tl.sum(b_q[:, None] * state.to(tl.float32), axis=0)
        tl.store(o + (i_bh * T + t) * V + rv, b_o.to(o.dtype.element_ty))


def _half_state(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The kernel on d and dv padded with zeros to powers of 2 (tl.arange's)."""
    b, h, n, dv = *q.shape[:3], v.shape[-1]
    q, k, v = (F.pad(t, (0, triton.next_power_of_2(t.shape[-1]) - t.shape[-1])).contiguous()
               for t in (q, k, v))  # fmt: skip
    o = torch.empty_like(v)
    _half_state_kernel[(b * h,)](q, k, v, o, n, q.shape[-1], v.shape[-1])
    return o[..., :dv]


def test_no_tf32_cause_for_a_kernel_without_tl_dot():
    """Issue 51's newcomer case: a Triton kernel without tl.dot that keeps its state in
    float16 fails float32's budget by about TF32's error, under --tf32; no product of it
    is TF32's, so the failure is not put down to TF32 products (nor is the flag advised):
    it is put down to the casts to float16 the interpreter saw run, at their source line,
    and to nothing without them; the same failure with a recorded TF32 tl.dot would be
    TF32's (the figure the checks set)."""
    from linattn_verify.cases import Case
    from linattn_verify.checks import CHECKS
    from linattn_verify.under_test import resolve
    from linattn_verify.vet.causes import name_cause

    case = Case(1, 2, 24, 16, 16, "float32", "normal", 1.0, 3, None, "cpu")
    claim = {"feature_map": "identity", "causal": True, "normalize": False}
    impl = resolve(_half_state, triton="interpret", tf32=True, **claim)
    found = CHECKS["reference"](impl, case)
    assert not found.passed and "tf32_dots" not in found.figures, found.message
    named = name_cause(found.to_dict(), impl.spec)  # what ran: its casts to float16
    source, first = inspect.getsourcelines(_half_state_kernel.fn)
    line = first + next(i for i, text in enumerate(source) if "state = (state" in text)
    assert named is not None and named.key == "narrowed", found.message
    assert named.advice == () and f"tests/test_triton_interpret.py:{line}" in named.short
    row = found.to_dict()
    row["figures"] = row["figures"] | {"max_error": found.figures["max_error"] / 100}
    assert name_cause(row, impl.spec) is None, "casts named for an error far below their size"
    row["figures"] = {k: v for k, v in found.figures.items() if k != "narrowed"}
    assert name_cause(row, impl.spec) is None, "a cause named without its mechanism"
    row["figures"] = row["figures"] | {"tf32_dots": 1}
    cause = name_cause(row, impl.spec)
    assert cause is not None and cause.key == "tf32-products", found.message


def _tf32_products(q, k, v, g):
    """A decayed form whose q, k, v are rounded to TF32 first: what tensor cores multiply."""
    from linattn_verify import attention
    from linattn_verify.inputs import round_to_tf32

    q, k, v = (round_to_tf32(t) for t in (q, k, v))
    return attention(q, k, v, "identity", causal=True, normalize=False, decay="gates", g=g)


def test_tf32_products_are_named_in_the_decay_check():
    """The decay check judges a case at a rate of its own: the cause re-evaluates it there
    (this kernel rounds to TF32 in plain torch: its evidence, a TF32 tl.dot's, is given as
    the interpreter's figure)."""
    from linattn_verify.cases import Case
    from linattn_verify.checks import CHECKS
    from linattn_verify.under_test import resolve
    from linattn_verify.vet.causes import name_cause

    impl = resolve(_tf32_products, feature_map="identity", causal=True, normalize=False,
                   decay="gates")  # fmt: skip
    failed = 0
    for seed in range(3):  # the case's CRC picks the rate: near 1, near 0, wide decay sums
        case = Case(2, 2, 9, 8, 2, "float32", "normal", 1.0, seed, None, "cpu")
        found = CHECKS["decay"](impl, case)
        if not found.passed:
            failed += 1
            assert name_cause(found.to_dict(), impl.spec) is None  # no tl.dot ran
            row = found.to_dict()
            row["figures"] = row["figures"] | {"tf32_dots": 1}
            cause = name_cause(row, impl.spec)
            assert cause is not None and cause.key == "tf32-products", found.message
    assert failed


_SEEN: list[tuple[str, bool]] = []  # what _SeesTf32 saw


class _SeesTf32(torch.autograd.Function):
    """Identity attention's stand-in whose forward and backward record the interpreter's TF32
    setting at the time they run."""

    @staticmethod
    def forward(ctx, v):
        _SEEN.append(("forward", triton_interpret.STATE.tf32))
        return v.clone()

    @staticmethod
    def backward(ctx, g):
        _SEEN.append(("backward", triton_interpret.STATE.tf32))
        return g


def test_the_backward_runs_with_the_forwards_tf32_setting():
    """--tf32 rounds a kernel's backward products too, as a GPU does for both passes."""
    from linattn_verify.cases import Case
    from linattn_verify.checks.gradients import autograd_gradients
    from linattn_verify.under_test import resolve

    impl = resolve(lambda q, k, v: _SeesTf32.apply(v), feature_map="identity", causal=True,
                   normalize=False, triton="interpret", tf32=True)  # fmt: skip
    q, k, v, w = Case(1, 1, 3, 2, 2, "float32", "normal", 1.0, 0, None, "cpu").tensors()
    _SEEN.clear()
    autograd_gradients(impl, q, k, v, w, torch.ones_like(v))
    assert _SEEN == [("forward", True), ("backward", True)]
    assert triton_interpret.STATE.tf32 is False  # restored after the call


@triton.jit
def _per_head(v, gamma, o, T, H, V: tl.constexpr, WIDE: tl.constexpr):
    """o = gamma_h v, a program per (batch x head, token): gamma indexed by an int32 head,
    the row by an offset in int64 (WIDE) or in int32."""
    i_bh, i_t = tl.program_id(0), tl.program_id(1)
    g = tl.load(gamma + i_bh % H)
    start = i_bh * T * V
    if WIDE:
        start = i_bh.to(tl.int64) * T * V
    cols = tl.arange(0, 4)
    row = v + start
    x = tl.load(row + i_t * V + cols, mask=cols < V, other=0.0)
    tl.store(o + start + i_t * V + cols, x * g, mask=cols < V)


def _scaled_by_head(wide: bool):
    def fn(q, k, v, gamma):
        b, h, n, dv = v.shape
        v = v.contiguous()
        o = torch.empty_like(v)
        _per_head[(b * h, n)](v, gamma, o, n, h, V=dv, WIDE=wide)
        return o

    return fn


def test_int32_offsets_are_flagged_where_they_grow_with_the_batch_or_heads():
    """The row's start in int32 grows with B H past a slice: flagged, naming the argument;
    in int64 the int32 offsets left (a token's, gamma's per-head index) are not."""
    from linattn_verify.under_test import resolve
    from linattn_verify.vet.tasks import int32_offsets

    claim = {"feature_map": "identity", "causal": True, "normalize": False,
             "decay": "constant", "triton": "interpret"}  # fmt: skip
    (wide,) = int32_offsets(resolve(_scaled_by_head(True), **claim), "cpu")
    assert wide["status"] == "pass", wide["detail"]
    (narrow,) = int32_offsets(resolve(_scaled_by_head(False), **claim), "cpu")
    assert narrow["status"] == "fail" and "_per_head's v" in narrow["detail"], narrow["detail"]


def test_an_int32_offsets_finding_has_a_command_that_reruns_it(tmp_path):
    """Issue 51, item 9: the int32-offsets row had no reproduce line (no `check` command runs
    it). Its command, run, finds the same offsets again."""
    from linattn_verify.cli import main
    from linattn_verify.under_test import resolve
    from linattn_verify.vet.tasks import INT32_OFFSETS, int32_offsets

    target = "tests.zoo.triton_kernels:triton_int32_offsets"  # (i_bh T + t) K in int32
    claim = {"feature_map": "identity", "causal": True, "normalize": False,
             "triton": "interpret"}  # fmt: skip
    (row,) = int32_offsets(resolve(target, **claim), "cpu")
    assert row["status"] == "fail" and row["reproduce"], row
    words = shlex.split(row["reproduce"])
    assert words[:4] == ["python", "-m", "linattn_verify", "vet"] and target in words, words
    out = tmp_path / "vet.json"
    assert main([*words[3:], "--quiet", "--json", str(out)]) == 1
    rows = [r for r in json.loads(out.read_text())["checks"] if r["name"] == INT32_OFFSETS]
    assert [(r["status"], r["detail"]) for r in rows] == [("fail", row["detail"])]


def test_a_declared_tf32_with_no_tl_dot_to_apply_to_is_judged_in_float32s_unit():
    """Issue 51, item 1: --dot-precision tf32 widens only what a tl.dot computed. The kernel
    above has none, so the declaration (vet's old advice for its error) rescues nothing: it
    is judged in float32's unit, and fails; the summary says why."""
    from linattn_verify.under_test import resolve
    from linattn_verify.vet.runner import VetOptions, vet_in_process

    claim = {"feature_map": "identity", "causal": True, "normalize": False}
    impl = resolve(_half_state, triton="interpret", tf32=True, dot_precision="tf32", **claim)
    options = VetOptions(dtypes=("float32",), smallest=True, longest=0, envelope=False)
    report = vet_in_process(impl, options)
    assert report.verdict == "fail", report.summary()
    assert "accuracy float32" in {row["name"] for row in report.failed}
    assert "--dot-precision tf32 has nothing to apply to" in report.summary()
    assert "tf32 products" in report.spec  # the spec as claimed, in the header


@triton.jit
def _store_half(x, kept, out, B: tl.constexpr):
    r = tl.arange(0, B)
    a = tl.load(x + r) * 3.0
    tl.store(kept + r, a.to(kept.dtype.element_ty))  # an intermediate, read back below
    tl.store(out + r, (a + 1.0).to(out.dtype.element_ty))  # returned, read by no kernel


@triton.jit
def _read_half(kept, out2, B: tl.constexpr):
    r = tl.arange(0, B)
    tl.store(out2 + r, tl.load(kept + r).to(tl.float32) * 2.0)


def test_a_narrowed_store_is_counted_where_a_later_kernel_reads_it_back():
    """STATE.stored: what a kernel stores narrowed and a later launch loads, by the storing
    line and the tensor's argument; a narrowed store no launch reads back is not in it."""
    x = torch.arange(16, dtype=torch.float32)
    kept, out = torch.empty(16, dtype=torch.float16), torch.empty(16, dtype=torch.bfloat16)
    out2 = torch.empty(16, dtype=torch.float32)
    before = dict(triton_interpret.STATE.stored)
    _store_half[(1,)](x, kept, out, 16)
    assert triton_interpret.STATE.stored == before  # stored, not yet read back
    _read_half[(1,)](kept, out2, 16)
    _read_half[(1,)](kept, out2, 16)
    new = {k: n - before.get(k, 0) for k, n in triton_interpret.STATE.stored.items()}
    new = {k: n for k, n in new.items() if n}
    source, first = inspect.getsourcelines(_store_half.fn)
    line = first + next(i for i, text in enumerate(source) if "an intermediate" in text)
    assert new == {("float32", "float16", f"{__file__}:{line}", "_store_half's kept"): 2}
    assert torch.equal(out2, (x * 3.0).half().float() * 2.0)
