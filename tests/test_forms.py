"""The built-in forms: agreement with the exact reference under the accuracy model,
streaming, gradients, the torch sampler, and bad input."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.stats
import torch

import linattn_verify as lv
from linattn_verify.accuracy import judge
from linattn_verify.families import exact, golden_attention, validate
from linattn_verify.families.kernelised import forms

KERNELISED = [n for n, fm in lv.FEATURE_MAPS.items() if fm.kernelised]
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
CHUNK = 16
N = 37  # two full chunks of 16 and a ragged tail
SUMS = 4  # sums behind a gradient element: numerator, denominator, their two backward terms


def _inputs(name: str, dtype: torch.dtype, n: int = N, seed: int = 0, noncontiguous=False):
    g = torch.Generator().manual_seed(seed)
    shape = (2, n, 3, 6) if noncontiguous else (2, 3, n, 6)
    q, k = (torch.randn(*shape, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 3, n, 5, generator=g, dtype=torch.float64)
    if noncontiguous:  # (B, N, H, d) storage seen as (B, H, N, d)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    w = None
    if lv.FEATURE_MAPS[name].needs_projection:
        w = lv.sample_projection_torch(6, 6, "orthogonal", g, dtype)
    return q.to(dtype), k.to(dtype), v.to(dtype), w


def _assert_close_to_form(grad: torch.Tensor, other: torch.Tensor, n: int) -> None:
    """Two forms' gradients of the same loss: each element is formed from a few (at most
    SUMS) sums over n tokens, each within gamma_n ~ n u of its absolute sum (Higham, Thm
    3.1), so the two differ by at most 2 SUMS n u times the gradient's scale (inputs are
    kept away from cancellation and 0/0 rows)."""
    u = torch.finfo(grad.dtype).eps / 2
    tolerance = 2 * SUMS * n * u * other.abs().max()
    assert (grad - other).abs().max() <= tolerance


def _forms(causal: bool) -> list[str]:
    return ["quadratic", "chunked", "recurrent"] if causal else ["quadratic", "linear"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", KERNELISED)
def test_every_form_is_within_bound_and_budget(name, causal, dtype):
    q, k, v, w = _inputs(name, dtype, noncontiguous=True)
    spec = lv.Spec(name, causal=causal)
    x = validate(q, k, v, spec, w)
    ref = exact(x, spec)
    golden = [golden_attention(q, k, v, spec, w, form) for form in ("quadratic", "linear")]
    for form in _forms(causal):
        out = lv.attention(q, k, v, name, causal, form, w, chunk_size=CHUNK)
        assert out.dtype == dtype and out.shape == (2, 3, N, 5)
        verdict = judge(out, x, spec, ref, golden=golden)
        assert verdict.passed, f"{form}: {verdict.message}"


@pytest.mark.parametrize("name", KERNELISED)
def test_streaming_pieces_equal_one_pass(name):
    q, k, v, w = _inputs(name, torch.float32)
    spec = lv.Spec(name, causal=True)
    x = validate(q, k, v, spec, w)
    ref = exact(x, spec)
    golden = [golden_attention(q, k, v, spec, w, form) for form in ("quadratic", "linear")]
    stream = lv.CausalStream(name, w, chunk_size=CHUNK, max_len=N)
    cuts = [0, 1, 5, 21, N]  # a single token, a piece inside a chunk, a ragged remainder
    pieces = [
        stream(q[..., a:b, :], k[..., a:b, :], v[..., a:b, :]) for a, b in itertools.pairwise(cuts)
    ]
    out = torch.cat(pieces, dim=-2)
    assert stream.state.position == N
    assert judge(out, x, spec, ref, golden=golden).passed
    one_pass = lv.attention(q, k, v, name, True, "chunked", w, chunk_size=CHUNK)
    assert judge(one_pass, x, spec, ref, golden=golden).passed


def test_performer_stream_rescales_its_state_when_the_key_shift_grows():
    """Early keys of large norm have tiny positive-map features (exp(-|x'|^2/2)); later
    ones raise the key shift: the old state must be rescaled, not dropped or overflowed."""
    name = "performer-positive"
    q, k, v, w = _inputs(name, torch.float32)
    k = k.clone()
    k[..., :20, :] *= 6.0
    spec = lv.Spec(name, causal=True)
    x = validate(q, k, v, spec, w)
    ref = exact(x, spec)
    stream = lv.CausalStream(name, w, chunk_size=CHUNK)
    first = stream(q[..., :20, :], k[..., :20, :], v[..., :20, :])
    shift_after_first = stream.state.shift.clone()
    second = stream(q[..., 20:, :], k[..., 20:, :], v[..., 20:, :])
    assert torch.all(stream.state.shift > shift_after_first)  # the rescaling ran
    golden = [golden_attention(q, k, v, spec, w, form) for form in ("quadratic", "linear")]
    verdict = judge(torch.cat([first, second], dim=-2), x, spec, ref, golden=golden)
    assert verdict.passed, verdict.message


@pytest.mark.parametrize("form", ["quadratic", "chunked", "recurrent"])
def test_causal_performer_keys_scale_by_the_past_not_the_future(form):
    """Small early keys and large later ones (in log-feature terms) in one chunk: a key
    scale taken over all keys would underflow the early rows to 0/0."""
    name = "performer-positive"
    q, k, v, w = _inputs(name, torch.float32, n=40)
    k = k.clone()
    k[..., :20, :] *= 8.0
    spec = lv.Spec(name, causal=True)
    x = validate(q, k, v, spec, w)
    ref = exact(x, spec)
    out = lv.attention(q, k, v, name, True, form, w, chunk_size=64)
    golden = [golden_attention(q, k, v, spec, w, f) for f in ("quadratic", "linear")]
    assert not torch.isnan(out).any()
    verdict = judge(out, x, spec, ref, golden=golden)
    assert verdict.passed, verdict.message


@pytest.mark.parametrize("name", ["elu", "relu", "taylor"])
def test_chunk_prefix_survives_a_huge_later_key_in_the_same_chunk(name):
    """Keys 1e3 times larger after the query, inside its chunk: an exclusive prefix formed
    as (sum up to the chunk) - (the chunk) would cancel the small prefix away."""
    q, k, v, _ = _inputs(name, torch.float32, n=32)
    q, k = q.abs(), k.abs().clone()
    k[..., 20:, :] *= 30.0 if name == "taylor" else 1e3
    spec = lv.Spec(name, causal=True)
    x = validate(q, k, v, spec)
    ref = exact(x, spec)
    golden = [golden_attention(q, k, v, spec, None, f) for f in ("quadratic", "linear")]
    out = lv.attention(q, k, v, name, True, "chunked", chunk_size=16)
    verdict = judge(out, x, spec, ref, golden=golden)
    assert verdict.passed, verdict.message


def test_a_stream_refuses_a_piece_of_another_layout():
    q, k, v, _ = _inputs("elu", torch.float32, n=4)
    stream = lv.CausalStream("elu")
    stream(q, k, v)
    with pytest.raises(lv.SpecError, match="does not continue a stream"):
        stream(q[:1], k[:1], v[:1])
    with pytest.raises(lv.SpecError, match="chunk_size must be"):
        lv.CausalStream("elu", chunk_size=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", KERNELISED)
def test_fast_forms_carry_their_state_across_blocks(name, causal, dtype, monkeypatch):
    """Blocks of 32 rows (chunks of 16) over N = 77: two full blocks and a ragged one,
    scratch tensors reused between them; judged as above."""
    monkeypatch.setattr(forms, "BLOCK_ROWS", 32)
    q, k, v, w = _inputs(name, dtype, n=77, seed=4)
    spec = lv.Spec(name, causal=causal)
    x = validate(q, k, v, spec, w)
    golden = [golden_attention(q, k, v, spec, w, form) for form in ("quadratic", "linear")]
    out = lv.attention(q, k, v, name, causal, "chunked" if causal else "linear", w, chunk_size=16)
    verdict = judge(out, x, spec, exact(x, spec), golden=golden)
    assert verdict.passed, verdict.message


@pytest.mark.parametrize("name", ["elu", "cosformer", "performer-positive"])
def test_gradients_across_blocks_match_the_quadratic_form(name, monkeypatch):
    """The chunked form's backward through several blocks (autograd: no scratch reuse)."""
    monkeypatch.setattr(forms, "BLOCK_ROWS", 8)
    q, k, v, w = _inputs(name, torch.float64, n=21, seed=5)
    if name == "cosformer":  # away from relu's kink and from 0/0 rows
        q, k = q.abs() + 0.1, k.abs() + 0.1
    grads = []
    for form, chunk in (("quadratic", 4), ("chunked", 4)):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = lv.attention(*leaves, name, True, form, w, chunk_size=chunk)
        grads.append(torch.autograd.grad(out.square().sum(), leaves))
    for fast, slow in zip(*grads):
        _assert_close_to_form(fast, slow, 21)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", ["elu", "relu"])
def test_a_stream_keeps_the_gradient_of_its_state(name, dtype):
    """A first piece whose keys record a gradient, then a plain one: the second piece's
    output depends on the first's keys through the carried state."""
    q, k, v, _ = _inputs(name, dtype, n=40, seed=6)
    q, k = q.abs() + 0.1, k.abs() + 0.1  # away from relu's kink and from 0/0 rows
    k1 = k[..., :20, :].clone().requires_grad_()
    stream = lv.CausalStream(name, chunk_size=16)
    stream(q[..., :20, :], k1, v[..., :20, :])
    out = stream(q[..., 20:, :], k[..., 20:, :], v[..., 20:, :])
    (grad,) = torch.autograd.grad(out.sum(), k1)
    k2 = k.clone().requires_grad_()
    whole = lv.attention(q, k2, v, name, True, "quadratic")[..., 20:, :]
    (expected,) = torch.autograd.grad(whole.sum(), k2)
    _assert_close_to_form(grad, expected[..., :20, :], 40)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", KERNELISED)
def test_gradients_match_finite_differences(name, causal):
    q, k, v, w = _inputs(name, torch.float64, n=6, seed=1)
    if name in ("relu", "cosformer"):  # away from relu's kink and from 0/0 rows
        q, k = q.abs() + 0.1, k.abs() + 0.1
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    for form in _forms(causal):

        def fn(q, k, v, form=form):
            return lv.attention(q, k, v, name, causal, form, w, chunk_size=4)

        assert torch.autograd.gradcheck(fn, (q, k, v), fast_mode=True), form


@pytest.mark.parametrize("causal", [False, True])
def test_softmax_gradients_match_finite_differences(causal):
    q, k, v, _ = _inputs("softmax", torch.float64, n=6, seed=2)
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    fn = lambda q, k, v: lv.attention(q, k, v, "softmax", causal)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v), fast_mode=True)


def test_softmax_has_only_the_quadratic_form():
    q, k, v, _ = _inputs("elu", torch.float32)
    out = lv.attention(q, k, v, "softmax", True)
    ref = lv.reference(q, k, v, "softmax", True)
    assert np.nanmax(np.abs(out.double().numpy() - ref)) < 1e-5
    with pytest.raises(lv.SpecError, match="only form='quadratic'"):
        lv.attention(q, k, v, "softmax", True, "chunked")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"form": "linear", "causal": True}, "use 'chunked' or 'recurrent'"),
        ({"form": "chunked"}, "use 'linear'"),
        ({"form": "flash"}, "unknown form"),
        ({"form": "chunked", "causal": True, "chunk_size": 0}, "chunk_size must be"),
        ({"feature_map": "performer-trig"}, "needs projection"),
    ],
)
def test_bad_calls_are_clear_errors(kwargs, message):
    q, k, v, _ = _inputs("elu", torch.float32, n=4)
    args = {"feature_map": "elu", **kwargs}
    with pytest.raises(lv.SpecError, match=message):
        lv.attention(q, k, v, **args)


def test_bad_tensors_are_clear_errors():
    q, k, v, _ = _inputs("elu", torch.float32, n=4)
    with pytest.raises(lv.SpecError, match="share one dtype"):
        lv.attention(q, k.double(), v)
    with pytest.raises(lv.SpecError, match="non-finite"):
        lv.attention(q, k, v * float("nan"))
    with pytest.raises(lv.SpecError, match="must be a torch tensor"):
        lv.attention(q.numpy(), k, v)


def test_cosformer_stream_needs_its_length_and_keeps_to_it():
    with pytest.raises(lv.SpecError, match="max_len"):
        lv.CausalStream("cosformer")
    q, k, v, _ = _inputs("cosformer", torch.float32, n=4)
    stream = lv.CausalStream("cosformer", max_len=6)
    stream(q, k, v)
    with pytest.raises(lv.SpecError, match="longer than max_len"):
        stream(q, k, v)


# Under the null (same distribution) a KS p-value below this has this probability.
FALSE_FAILURE = 1e-6


@pytest.mark.parametrize("kind", ["iid", "orthogonal", "orthogonal-fixed-norm"])
def test_torch_sampler_has_the_spec_samplers_distribution(kind):
    g = torch.Generator().manual_seed(0)
    ours = lv.sample_projection_torch(3000, 8, kind, g, torch.float64).numpy()
    spec = lv.sample_projection(3000, 8, kind, seed=1)
    for stat in (lambda w: np.linalg.norm(w, axis=1), lambda w: w[:, 0]):
        p = scipy.stats.ks_2samp(stat(ours), stat(spec)).pvalue
        assert p > FALSE_FAILURE, kind
    block = ours[:8] / np.linalg.norm(ours[:8], axis=1, keepdims=True)
    if kind != "iid":
        np.testing.assert_allclose(block @ block.T, np.eye(8), atol=1e-12)


def test_torch_sampler_follows_its_generator():
    draw = lambda seed: lv.sample_projection_torch(  # noqa: E731
        5, 3, "orthogonal", torch.Generator().manual_seed(seed)
    )
    assert torch.equal(draw(3), draw(3)) and not torch.equal(draw(3), draw(4))


@pytest.mark.parametrize("causal", [False, True])
def test_elu_negative_coordinates_in_different_places_do_not_underflow(causal):
    # exp(-29) exp(-80) is below float32's range: unshifted features give 0/0
    q = torch.tensor([[[[-29.0, -80.0]]]])
    k = torch.tensor([[[[-80.0, -29.0]]]])
    v = torch.tensor([[[[1.5]]]])
    for form in ("quadratic", "chunked" if causal else "linear"):
        assert lv.attention(q, k, v, "elu", causal=causal, form=form).item() == 1.5
