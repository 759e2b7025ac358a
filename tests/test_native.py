"""native.c, the elu features of the CPU float32 fast path: its accuracy, its input flags,
its strides, and the forms that use it, judged against the exact reference across
several blocks, with the kernel and without it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import linattn_verify as lv
from linattn_verify.accuracy import judge
from linattn_verify.families import exact, golden_attention, validate
from linattn_verify.families.kernelised import forms, native
from linattn_verify.families.kernelised.features import ELU_SHIFT_BELOW, plain_features
from linattn_verify.rounding import C_LIB

needs_kernel = pytest.mark.skipif(
    not native.status().startswith("on"), reason=f"native kernel {native.status()}"
)
# First-order error of native.c's e^x, for p = e^r in [0.707, 1.415] (scaling by 2^n is
# exact), in absolute terms against p's unit 2^-24 (p < 1) or 2^-23: the rounding of r
# (|r| < 0.35: 2^-26, times e^r <= 1.42), the polynomial's approximation (below the Taylor
# remainder r^8/8! < 2^-27.5, the minimax being no worse), the rounding of t = r + r^2 q
# (|t| < 0.5: 2^-26) and of q's Horner sum times r^2 < 0.125 (about 2^-27): 3.4 * 2^-26 =
# 0.86 units of 2^-24; plus half a unit for the final 1 + t: 1.36 units (0.93 for p >= 1).
# For x > 0 e^0 = 1 exactly and only 1 + x rounds: half a unit. Measured: 1.013.
ULP_LIMIT = 1.5
U32 = 2.0**-24


def _phi64(x: torch.Tensor) -> torch.Tensor:
    x = x.double()
    return torch.exp(torch.clamp(x, max=0.0)) + torch.clamp(x, min=0.0)


def _ulps(approx: torch.Tensor, exact64: torch.Tensor) -> torch.Tensor:
    spacing = torch.from_numpy(np.spacing(exact64.float().numpy())).double()
    return (approx.double() - exact64).abs() / spacing


@needs_kernel
def test_features_are_within_one_and_a_half_units_and_alike_in_every_loop():
    grid = torch.linspace(ELU_SHIFT_BELOW, 10.0, 1_000_000, dtype=torch.float32)
    specials = torch.tensor([0.0, -0.0, -1e-30, -1e-7, 1e-7, -0.5, -1.0, native.DOMAIN_MIN])
    scalar = torch.cat([grid, specials]).reshape(1, -1, 1)  # one column: the scalar loop
    vector = grid.reshape(1, -1, 8)  # the 8-wide loop
    outs = []
    for values in (scalar, vector):
        out = torch.empty_like(values)
        assert native.elu_features(values, out, native.DOMAIN_MIN)
        assert _ulps(out, _phi64(values)).max() <= ULP_LIMIT
        outs.append(out.flatten())
    assert torch.equal(outs[0][: grid.numel()], outs[1])  # the same bits either way


def test_the_fast_forms_elu_features_are_the_kernels_where_it_is_built(kernel):
    """plain_features is the kernel's where it is built, else torch's (golden.py has its
    own, golden_features.py)."""
    x = torch.randn(2, 3, 40, 9, generator=torch.Generator().manual_seed(3)) * 4
    out = torch.empty(6, 40, 9)
    features = plain_features(x, "elu", 40)
    if kernel == "kernel":
        assert native.elu_features(x.reshape(6, 40, 9), out, ELU_SHIFT_BELOW)
        assert torch.equal(features, out.view(2, 3, 40, 9))
    # torch's exp (features.exp): within C_LIB units, like the kernel's
    assert _ulps(features, _phi64(x)).max() <= C_LIB
    x.requires_grad_(True)
    assert plain_features(x, "elu", 40).grad_fn is not None  # autograd: torch's ops


@needs_kernel
@pytest.mark.parametrize("cols", [64, 13])  # 8-wide vectors only; vectors and a tail
def test_the_fused_denominator_is_within_the_dot_product_bound(cols):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 40, cols, generator=g) * 3
    z = torch.randn(3, 4, cols, generator=g).abs() * 100  # one z per group of 10 rows
    out, den = torch.empty_like(x), torch.empty(3, 40, 1)
    assert native.elu_features(x, out, ELU_SHIFT_BELOW, z, 10, den)
    products = out.double() * z.double().repeat_interleave(10, dim=1)
    exact_dot = products.sum(-1, keepdim=True)
    gamma = cols * U32 / (1 - cols * U32)  # Higham, Thm 3.1: |error| <= gamma_n sum |x y|
    assert ((den.double() - exact_dot).abs() <= gamma * products.abs().sum(-1, keepdim=True)).all()
    assert (den.double() - exact_dot).abs().max() > 0  # float32 arithmetic, not float64


@needs_kernel
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), ELU_SHIFT_BELOW - 1])
@pytest.mark.parametrize("where", [0, 19])  # in a vector, in the tail
def test_non_finite_or_very_negative_inputs_are_flagged(bad, where):
    x = torch.zeros(2, 3, 20)
    out = torch.empty_like(x)
    assert native.elu_features(x, out, ELU_SHIFT_BELOW)
    x[1, 2, where] = bad
    assert not native.elu_features(x, out, ELU_SHIFT_BELOW)
    x[1, 2, where] = ELU_SHIFT_BELOW  # the threshold itself is unshifted
    assert native.elu_features(x, out, ELU_SHIFT_BELOW)


@needs_kernel
def test_any_strides_in_and_rows_of_a_larger_buffer_out():
    g = torch.Generator().manual_seed(2)
    base = torch.randn(4, 30, 3, 17, generator=g)
    x = base[:, 5:25, 1, :]  # strided batch and rows
    buffer = torch.full((4, 32, 17), float("nan"))
    assert native.elu_features(x, buffer[:, :20], ELU_SHIFT_BELOW)
    assert _ulps(buffer[:, :20], _phi64(x)).max() <= ULP_LIMIT
    assert buffer[:, 20:].isnan().all()  # rows beyond the view are not written
    columns = torch.randn(4, 17, 20, generator=g).transpose(1, 2)  # last stride != 1
    out = torch.empty(4, 20, 17)
    assert native.elu_features(columns, out, ELU_SHIFT_BELOW)
    assert _ulps(out, _phi64(columns)).max() <= ULP_LIMIT
    with pytest.raises(ValueError, match="contiguous rows"):
        native.elu_features(x, torch.empty(4, 17, 20).transpose(1, 2), ELU_SHIFT_BELOW)


@pytest.fixture(params=["kernel", "eager"])
def kernel(request, monkeypatch):
    """The forms with native.c (skipped where it does not build) and without it."""
    native._library.cache_clear()
    if request.param == "eager":
        monkeypatch.setenv(native.SWITCH, "0")
    elif not native.status().startswith("on"):
        pytest.skip(f"native kernel {native.status()}")
    yield request.param
    monkeypatch.delenv(native.SWITCH, raising=False)
    native._library.cache_clear()


def _inputs(n: int, d: int, seed: int = 0, low: float = 0.0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(2, 3, n, d, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 3, n, 5, generator=g, dtype=torch.float64)
    if low:
        q[1, 2, 50, 3] = k[0, 1, 7, 0] = low
    return q.float(), k.float(), v.float()


def _judged(out, q, k, v, causal: bool) -> None:
    spec = lv.Spec("elu", causal=causal)
    x = validate(q, k, v, spec)
    golden = [golden_attention(q, k, v, spec, None, form) for form in ("quadratic", "linear")]
    verdict = judge(out, x, spec, exact(x, spec), golden=golden)
    assert verdict.passed, verdict.message


@pytest.mark.parametrize("low", [0.0, -40.0])  # -40: below the shift threshold
@pytest.mark.parametrize("causal", [False, True])
def test_fast_forms_over_several_blocks_are_within_bound_and_budget(kernel, causal, low):
    """Blocks of 32 rows (chunks of 16) over N = 77: a state carried through two full
    blocks and a ragged one, scratch tensors reused; d = 12 takes the kernel's vector
    loop and its tail."""
    q, k, v = _inputs(77, 12, low=low)
    calls, checks = [], []
    original, check = native.elu_features, forms.check_finite

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return original(*args, **kwargs)

    def check_spy(*args):
        checks.append(1)
        return check(*args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(forms, "BLOCK_ROWS", 32)
        patch.setattr(native, "elu_features", spy)
        patch.setattr(forms, "check_finite", check_spy)
        out = lv.attention(q, k, v, "elu", causal, "chunked" if causal else "linear", chunk_size=16)
        stream = lv.CausalStream("elu", chunk_size=16)
        cuts = [0, 1, 40, 77]
        pieces = [
            stream(q[..., a:b, :], k[..., a:b, :], v[..., a:b, :])
            for a, b in itertools.pairwise(cuts)
        ]
    _judged(out, q, k, v, causal)
    _judged(torch.cat(pieces, dim=-2), q, k, v, True)
    assert bool(calls) == (kernel == "kernel")  # the kernel's path, or eager torch's
    # the kernel's results are used unless it flags an input (then: checks, torch's path)
    assert bool(checks) == (kernel == "eager" or low < ELU_SHIFT_BELOW)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("causal", [False, True])
def test_non_finite_inputs_are_refused_on_either_path(kernel, causal, bad, monkeypatch):
    """In a later block (blocks of 32 rows), in the vector loop or the tail (d = 12)."""
    monkeypatch.setattr(forms, "BLOCK_ROWS", 32)
    q, k, v = _inputs(77, 12)
    form = "chunked" if causal else "linear"
    for name, where in (("q", (1, 1, 70, 2)), ("k", (0, 2, 40, 10)), ("v", (1, 0, 76, 4))):
        args = {"q": q, "k": k, "v": v}
        args[name] = args[name].clone()
        args[name][where] = bad
        with pytest.raises(lv.SpecError, match=f"{name} has a non-finite value"):
            lv.attention(args["q"], args["k"], args["v"], "elu", causal, form)
        stream = lv.CausalStream("elu", chunk_size=16)
        stream(*(t[..., :35, :] for t in args.values()))
        with pytest.raises(lv.SpecError, match=f"{name} has a non-finite value"):
            stream(*(t[..., 35:, :] for t in args.values()))
        assert stream.state.position == 35  # the refused piece left the state as it was


@needs_kernel
def test_the_kernel_refuses_what_it_cannot_take():
    x, out = torch.zeros(2, 4, 8), torch.empty(2, 4, 8)
    z, den = torch.zeros(2, 2, 8), torch.empty(2, 4)
    assert native.elu_features(x, out, ELU_SHIFT_BELOW, z, 2, den)
    for kwargs, message in (
        ({"z": torch.zeros(2, 1, 8)}, "ceil"),  # too few z for the rows
        ({"group": 0}, "ceil"),
        ({"low": native.DOMAIN_MIN - 1}, "low must be"),
        ({"x": x.double(), "out": out.double()}, "float32"),
    ):
        args = {"x": x, "out": out, "low": ELU_SHIFT_BELOW, "z": z, "group": 2, "den": den}
        with pytest.raises(ValueError, match=message):
            native.elu_features(**{**args, **kwargs})


def test_the_cache_folder_must_be_ours_alone(tmp_path):
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    assert native._private_dir(folder)
    folder.chmod(0o777)  # anyone could plant a library there
    assert not native._private_dir(folder)


@needs_kernel
def test_a_compiler_command_with_arguments(monkeypatch, tmp_path):
    native._library.cache_clear()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", "cc -std=gnu11")
    try:
        assert native.status().startswith("on (native-")
    finally:
        monkeypatch.undo()
        native._library.cache_clear()


def test_without_a_compiler_the_forms_use_eager_torch(monkeypatch, tmp_path):
    native._library.cache_clear()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    try:
        assert native.status().startswith("off: building native.c with false failed")
        q, k, v = _inputs(40, 8)
        _judged(lv.attention(q, k, v, "elu", False, "linear"), q, k, v, False)
    finally:
        monkeypatch.undo()
        native._library.cache_clear()
