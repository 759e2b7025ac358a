"""Broken random features: samplers whose rows are not N(0, I_d), samplers with unbiased rows
but the wrong dependence between them, and Performer attention whose error does not fall with
m. The statistical checks must reject each, for the right reason (tests/test_stats.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

import linattn_verify as lv


def unit_norm_rows(m: int, d: int, generator: torch.Generator) -> Tensor:
    """Gaussian directions of norm 1 instead of chi(d)."""
    w = torch.randn(m, d, generator=generator, dtype=torch.float64)
    return w / w.norm(dim=1, keepdim=True)


def rademacher_entries(m: int, d: int, generator: torch.Generator) -> Tensor:
    """Entries +-1: mean 0 and variance 1, but not Gaussian."""
    return torch.randint(0, 2, (m, d), generator=generator).double() * 2 - 1


def fixed_norm_orthogonal(m: int, d: int, generator: torch.Generator) -> Tensor:
    """Orthogonal blocks with every row of norm sqrt(d) (the project's biased sampler)."""
    return lv.sample_projection_torch(m, d, "orthogonal-fixed-norm", generator, torch.float64)


def duplicated_rows(m: int, d: int, generator: torch.Generator) -> Tensor:
    """Every Gaussian row twice: unbiased, but m rows carry the variance of m / 2."""
    w = torch.randn(-(-m // 2), d, generator=generator, dtype=torch.float64)
    return w.repeat_interleave(2, dim=0)[:m]


def iid_claimed_orthogonal(m: int, d: int, generator: torch.Generator) -> Tensor:
    """iid Gaussian rows, claimed orthogonal: unbiased, without the variance reduction."""
    return torch.randn(m, d, generator=generator, dtype=torch.float64)


BROKEN_SAMPLERS = {  # name: (sampler, what it claims, the check it must fail)
    "unit-norm-rows": (unit_norm_rows, "iid", "unbiasedness"),
    "rademacher-entries": (rademacher_entries, "iid", "unbiasedness"),
    "fixed-norm-orthogonal": (fixed_norm_orthogonal, "orthogonal", "unbiasedness"),
    "duplicated-rows": (duplicated_rows, "iid", "mse-formula"),
    "iid-claimed-orthogonal": (iid_claimed_orthogonal, "orthogonal", "orthogonal-mse"),
}

TRUNCATED_ROWS = 16


def truncated_features(q: Tensor, k: Tensor, v: Tensor, projection: Tensor) -> Tensor:
    """performer-positive that uses only the first 16 rows of W, however many it is given."""
    return lv.attention(q, k, v, "performer-positive", projection=projection[:TRUNCATED_ROWS])
