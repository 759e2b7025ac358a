"""Third-party linear-attention implementations behind one calling contract, for timing
side by side with ours.

    fn(q, k, v) -> out    # q, k: (B, H, N, d); v: (B, H, N, dv); out: (B, H, N, dv)

float32 CPU tensors, elu+1 feature map (Katharopoulos et al. 2020), non-causal or causal
(key j is used by query i iff j <= i):

    out_i = sum_j phi(q_i).phi(k_j) v_j / sum_j phi(q_i).phi(k_j),   phi(x) = elu(x) + 1

Each adapter only translates layouts and applies elu+1 where the library expects
already-mapped features; results are returned as the library computes them (each library
keeps its own eps in the denominator, see the docstrings). Peers that do not import here
are skipped; ``missing_peers()`` says why.

    python benchmarks/peers.py    # max |peer - float64 naive| per peer, both modes

Libraries (install with ``pip install --no-deps``, never letting pip touch torch):

* ``performer-pytorch`` (+ einops, local-attention, hyper-connections,
  axial-positional-embedding): ``linear_attention``, ``causal_linear_attention`` (whose
  causal product is fast_transformers' CPU/CUDA kernel) and the pure-torch
  ``causal_linear_attention_noncuda``.
* ``fla-core`` / ``flash-linear-attention``: only the pure-PyTorch
  ``fla/ops/linear_attn/naive.py``, loaded from its file without importing ``fla``
  (whose kernels need triton). Causal only.
* ``pytorch-fast-transformers`` 0.4.0 (C++ extensions built from source on CPU):
  ``LinearAttention``, ``CausalLinearAttention``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn.functional as F

Peer = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _elu1(x: torch.Tensor) -> torch.Tensor:
    return F.elu(x) + 1


# --- loaders (each raises on failure; results cached) ---------------------------------


@functools.cache
def _performer() -> ModuleType:
    from performer_pytorch import performer_pytorch

    return performer_pytorch


@functools.cache
def _causal_dot_product() -> ModuleType:
    # performer's causal_linear_attention imports this inside the call; check it up front
    from fast_transformers import causal_product

    return causal_product


@functools.cache
def _fla_naive() -> ModuleType:
    path = importlib.metadata.distribution("fla-core").locate_file("fla/ops/linear_attn/naive.py")
    spec = importlib.util.spec_from_file_location("_fla_linear_attn_naive", str(path))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _fast_transformers() -> ModuleType:
    import fast_transformers.attention
    import fast_transformers.masking

    return fast_transformers


# --- performer-pytorch ----------------------------------------------------------------


def performer_linear(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """performer_pytorch.linear_attention on (elu(q)+1, elu(k)+1, v), layout (B, H, N, d).

    Computes D_inv = 1 / (phi(q) . sum_j phi(k_j)) and out = (phi(q) (phi(K)^T V)) D_inv:
    normalised, no eps at all.
    """
    return _performer().linear_attention(_elu1(q), _elu1(k), v)


def performer_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """performer_pytorch.causal_linear_attention on (elu(q)+1, elu(k)+1, v), (B, H, N, d).

    Numerator from fast_transformers' CausalDotProduct (float32-only C++ kernel, built
    with -ffast-math, OpenMP over B*H). Denominator phi(q_i) . (cumsum_j phi(k_j) + eps)
    with eps = 1e-6 added to every component of the key cumsum, i.e. an extra
    eps * sum(phi(q_i)) rather than a scalar eps. The kernel walks the last axis by
    pointer, so inputs are made contiguous (a no-op for contiguous inputs).
    """
    _causal_dot_product()
    return _performer().causal_linear_attention(
        _elu1(q).contiguous(), _elu1(k).contiguous(), v.contiguous()
    )


def performer_causal_noncuda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """performer_pytorch.causal_linear_attention_noncuda on (elu(q)+1, elu(k)+1, v).

    Pure torch, layout (B, H, N, d); the source labels it "inefficient ..., for reader's
    reference, not being used". Same normalisation as ``performer_causal`` (eps = 1e-6 on
    each component of the key cumsum). Its chunk_size=128 is passed to Tensor.chunk, so
    it is the number of chunks (N=37 gives 37 chunks of one row), not their length; each
    chunk materialises a (B, H, chunk, d, dv) tensor.
    """
    return _performer().causal_linear_attention_noncuda(_elu1(q), _elu1(k), v)


# --- fla naive reference --------------------------------------------------------------


def fla_naive_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """fla naive_recurrent_linear_attn(normalize=True, scale=1.0), causal only.

    fla takes (B, T, H, d) and raw features (its layers apply the feature map), so this
    applies elu+1 and transposes in and out. It casts q, k, v to float32 internally,
    loops over T in Python (state S += k_t v_t^T; o_t = S^T (scale q_t)) and divides by
    (scale q_i) . cumsum_j k_j + 1e-10. scale (default d**-0.5) multiplies q in both
    numerator and denominator, so it cancels but for the 1e-10; 1.0 is passed.
    normalize defaults to False (un-normalised linear attention) and is set to True.
    """
    out, _ = _fla_naive().naive_recurrent_linear_attn(
        _elu1(q).transpose(1, 2),
        _elu1(k).transpose(1, 2),
        v.transpose(1, 2),
        scale=1.0,
        normalize=True,
    )
    return out.transpose(1, 2)


_FLA_CHUNK = 64  # hard-coded in naive_chunk_linear_attn


def fla_naive_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """fla naive_chunk_linear_attn(normalize=True, scale=1.0), causal only.

    Same layout, feature map and normalisation (+1e-10) as ``fla_naive_recurrent``, in
    chunks of 64 (inter-chunk state by cumsum, intra-chunk masked quadratic). It needs
    T % 64 == 0, so N is zero-padded at the end and the padding cut off the output;
    causally, trailing rows cannot affect earlier ones. No internal cast to float32.
    """
    n = q.shape[-2]
    pad = -n % _FLA_CHUNK
    qf, kf, vp = _elu1(q), _elu1(k), v
    if pad:
        qf, kf, vp = (F.pad(t, (0, 0, 0, pad)) for t in (qf, kf, vp))
    out = _fla_naive().naive_chunk_linear_attn(
        qf.transpose(1, 2), kf.transpose(1, 2), vp.transpose(1, 2), scale=1.0, normalize=True
    )
    return out.transpose(1, 2)[..., :n, :]


# --- pytorch-fast-transformers --------------------------------------------------------


@functools.cache
def _ft_module(causal: bool, d: int) -> torch.nn.Module:
    att = _fast_transformers().attention
    return att.CausalLinearAttention(d) if causal else att.LinearAttention(d)


def _fast_transformers_call(
    causal: bool, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    masking = _fast_transformers().masking
    b, _, n, d = q.shape
    lengths = masking.LengthMask(torch.full((b,), n, dtype=torch.long), max_len=n)
    attn_mask = masking.TriangularCausalMask(n) if causal else masking.FullMask(n, n)
    out = _ft_module(causal, d)(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask, lengths, lengths
    )
    return out.transpose(1, 2)


def fast_transformers_linear(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """fast_transformers.attention.LinearAttention(d) with a FullMask, non-causal.

    Layout (N, L, H, E) = (B, N, H, d), so this only transposes; the module applies
    elu(x)+1 itself (elu_feature_map) to raw q, k. out = phi(q) (phi(K)^T V) /
    (phi(q) . sum_j phi(k_j) + 1e-6): normalised, scalar eps 1e-6. Plain torch einsums.
    """
    return _fast_transformers_call(False, q, k, v)


def fast_transformers_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """fast_transformers.attention.CausalLinearAttention(d) with a TriangularCausalMask.

    Layout (B, N, H, d) (transposed here), elu(x)+1 applied by the module. Numerator
    from the causal_product C++ kernel (float32 only, -ffast-math, OpenMP over B*H),
    divided by phi(q_i) . cumsum_j phi(k_j) + 1e-6 (scalar eps).
    """
    return _fast_transformers_call(True, q, k, v)


# --- registry -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    name: str
    causal: bool
    fn: Peer
    loaders: tuple[Callable[[], object], ...]
    distribution: str
    source: str


_PERF, _FLA, _FT = "performer-pytorch", "fla-core", "pytorch-fast-transformers"
_REGISTRY: tuple[_Entry, ...] = (
    _Entry(
        "performer-pytorch",
        False,
        performer_linear,
        (_performer,),
        _PERF,
        "performer_pytorch.linear_attention",
    ),
    _Entry(
        "performer-pytorch",
        True,
        performer_causal,
        (_performer, _causal_dot_product),
        _PERF,
        "performer_pytorch.causal_linear_attention",
    ),
    _Entry(
        "performer-pytorch-noncuda",
        True,
        performer_causal_noncuda,
        (_performer,),
        _PERF,
        "performer_pytorch.causal_linear_attention_noncuda",
    ),
    _Entry(
        "fla-naive-recurrent",
        True,
        fla_naive_recurrent,
        (_fla_naive,),
        _FLA,
        "fla naive_recurrent_linear_attn",
    ),
    _Entry(
        "fla-naive-chunk",
        True,
        fla_naive_chunk,
        (_fla_naive,),
        _FLA,
        "fla naive_chunk_linear_attn",
    ),
    _Entry(
        "fast-transformers",
        False,
        fast_transformers_linear,
        (_fast_transformers,),
        _FT,
        "fast_transformers LinearAttention",
    ),
    _Entry(
        "fast-transformers",
        True,
        fast_transformers_causal,
        (_fast_transformers,),
        _FT,
        "fast_transformers CausalLinearAttention",
    ),
)


def _load_error(entry: _Entry) -> str | None:
    for loader in entry.loaders:
        try:
            loader()
        except Exception as exc:  # any import-time failure means "not available here"
            first = (str(exc).strip().splitlines() or [""])[0]
            return f"{type(exc).__name__}: {first}"
    return None


def available_peers(causal: bool) -> dict[str, Peer]:
    """The peers for this mode whose libraries import here, by name."""
    return {e.name: e.fn for e in _REGISTRY if e.causal == causal and _load_error(e) is None}


def missing_peers(causal: bool | None = None) -> dict[str, str]:
    """Peers left out, with a one-line reason: import failures (for both modes unless
    ``causal`` is given) and, for a given mode, peers the library offers only in the other
    mode (keyed ``name[causal]`` / ``name[non-causal]``)."""
    out: dict[str, str] = {}
    for e in _REGISTRY:
        if causal is not None and e.causal != causal:
            continue
        reason = _load_error(e)
        if reason is not None:
            out.setdefault(e.name, reason)
    if causal is not None:
        names = {e.name for e in _REGISTRY if e.causal == causal}
        mode = "causal" if causal else "non-causal"
        for e in _REGISTRY:
            if e.name not in names:
                other = "non-causal" if causal else "causal"
                out[f"{e.name}[{mode}]"] = f"{e.source} is {other} only"
    return out


def peer_versions() -> dict[str, str]:
    """Installed version of each peer's distribution (or 'not installed')."""
    out: dict[str, str] = {}
    for e in _REGISTRY:
        try:
            out[e.distribution] = importlib.metadata.version(e.distribution)
        except importlib.metadata.PackageNotFoundError:
            out[e.distribution] = "not installed"
    return out


# --- self-check -----------------------------------------------------------------------


def naive_elu_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
) -> torch.Tensor:
    """Quadratic elu+1 linear attention in float64, no eps: the check's reference."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    a = _elu1(q) @ _elu1(k).transpose(-1, -2)
    if causal:
        a = torch.tril(a)
    return (a @ v) / a.sum(-1, keepdim=True)


def _main() -> None:
    gen = torch.Generator().manual_seed(0)
    b, h, n, d, dv = 2, 2, 37, 8, 5
    q = torch.randn(b, h, n, d, generator=gen)
    k = torch.randn(b, h, n, d, generator=gen)
    v = torch.randn(b, h, n, dv, generator=gen)
    print("versions:", ", ".join(f"{k_}={v_}" for k_, v_ in peer_versions().items()))
    print(f"inputs: float32, B={b} H={h} N={n} d={d} dv={dv}; reference: float64 naive")
    for causal in (False, True):
        mode = "causal" if causal else "non-causal"
        ref = naive_elu_attention(q, k, v, causal)
        print(f"\n[{mode}]")
        for name, fn in available_peers(causal).items():
            with torch.no_grad():
                out = fn(q, k, v)
            assert out.shape == ref.shape, (name, out.shape)
            err = (out.to(torch.float64) - ref).abs().max().item()
            print(f"  {name:38s} max|diff| = {err:.3e}  ({out.dtype})")
        for name, reason in missing_peers(causal).items():
            print(f"  {name:38s} skipped: {reason}")


if __name__ == "__main__":
    _main()
