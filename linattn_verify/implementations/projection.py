"""Projection matrices W (m, d) drawn in torch from an explicit torch.Generator.

The same distributions as linattn_verify.sampling (see its docstring for the sources):
iid N(0, 1) rows; orthogonal blocks (QR of Gaussian d x d blocks, signs fixed for Haar)
with chi(d) row norms, drawn as norms of independent Gaussian d-vectors; and the biased
fixed-norm variant with every row of norm sqrt(d).
"""

from __future__ import annotations

import torch

from ..sampling import SAMPLERS
from ..specs import SpecError


def _orthogonal_directions(m: int, d: int, gen: torch.Generator, **like) -> torch.Tensor:
    """m rows from ceil(m / d) Haar-orthogonal d x d blocks, one batched QR."""
    qmat, rmat = torch.linalg.qr(torch.randn(-(-m // d), d, d, generator=gen, **like))
    blocks = (qmat * torch.sign(torch.diagonal(rmat, dim1=-2, dim2=-1))[:, None, :]).mT
    return blocks.reshape(-1, d)[:m]


def sample_projection_torch(
    m: int,
    d: int,
    kind: str = "iid",
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """W of shape (m, d), drawn by sampler `kind` from `generator` (computed in float64,
    returned in `dtype` on `device`)."""
    if kind not in SAMPLERS:
        raise SpecError(f"unknown projection sampler {kind!r}; known: {', '.join(SAMPLERS)}")
    if not (isinstance(m, int) and isinstance(d, int) and m >= 1 and d >= 1):
        raise SpecError(f"m and d must be positive integers, got m={m!r}, d={d!r}")
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    like = {"dtype": torch.float64, "device": gen.device}
    if kind == "iid":
        w = torch.randn(m, d, generator=gen, **like)
    elif kind == "orthogonal":
        norms = torch.randn(m, d, generator=gen, **like).norm(dim=1)  # chi(d)
        w = _orthogonal_directions(m, d, gen, **like) * norms[:, None]
    else:
        w = _orthogonal_directions(m, d, gen, **like) * d**0.5
    return w.to(device=device, dtype=dtype)
