"""Projections drawn from a sampler under test, and the kernel estimates they give.

A sampler is any callable `sampler(m, d, generator) -> W` with W an (m, d) torch tensor or
numpy array and `generator` a torch.Generator that it must draw from (so a seed fixes every
draw). One call is one replicate: replicates are independent because the generator moves on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from ..implementations.projection import sample_projection_torch
from ..sampling import SAMPLERS
from ..specs import SpecError
from .moments import KINDS

SamplerFn = Callable[[int, int, torch.Generator], Any]


class SamplerFailure(Exception):
    """The sampler under test raised or returned something that is not an (m, d) matrix."""


def builtin_sampler(kind: str) -> SamplerFn:
    """The project's torch sampler `kind` (iid, orthogonal, orthogonal-fixed-norm)."""
    if kind not in SAMPLERS:
        raise SpecError(f"unknown projection sampler {kind!r}; known: {', '.join(SAMPLERS)}")

    def sampler(m: int, d: int, generator: torch.Generator) -> torch.Tensor:
        return sample_projection_torch(m, d, kind, generator, dtype=torch.float64)

    sampler.__name__ = f"lv.sample_projection_torch[{kind}]"
    return sampler


def numpy_sampler(kind: str) -> SamplerFn:
    """The project's numpy sampler `kind`, seeded from the torch generator."""
    if kind not in SAMPLERS:
        raise SpecError(f"unknown projection sampler {kind!r}; known: {', '.join(SAMPLERS)}")
    draw = SAMPLERS[kind].draw

    def sampler(m: int, d: int, generator: torch.Generator) -> np.ndarray:
        seed = int(torch.randint(2**62, (1,), generator=generator))
        return draw(m, d, np.random.default_rng(seed))

    sampler.__name__ = f"lv.sample_projection[{kind}]"
    return sampler


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one intra-op thread, restored after: the replicates are thousands of tiny
    ops (d x d QRs, N x m matmuls), which ran some 30x slower with 2 threads on 2 cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def draw_projections(sampler: SamplerFn, m: int, d: int, replicates: int, seed: int) -> np.ndarray:
    """(replicates, m, d) float64: one sampler call per replicate from one generator."""
    generator = torch.Generator().manual_seed(seed)
    out = np.empty((replicates, m, d))
    with one_thread():
        for r in range(replicates):
            out[r] = _one_draw(sampler, m, d, generator)
    return out


def _one_draw(sampler: SamplerFn, m: int, d: int, generator: torch.Generator) -> np.ndarray:
    """One (m, d) float64 matrix from the sampler, or SamplerFailure saying what is wrong."""
    try:
        w = sampler(m, d, generator)
    except Exception as err:  # the sampler's failure is a finding, not a crash
        raise SamplerFailure(f"sampler raised {type(err).__name__}: {err}") from None
    if isinstance(w, torch.Tensor):
        w = w.detach().to("cpu", torch.float64).numpy()
    w = np.asarray(w, dtype=np.float64)
    if w.shape != (m, d):
        raise SamplerFailure(f"sampler returned shape {w.shape} for (m, d) = ({m}, {d})")
    if not np.isfinite(w).all():
        raise SamplerFailure("sampler returned non-finite entries")
    return w


def row_terms(kind: str, x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """h(w_l) for every row (moments.py's definitions), float64, shape w.shape[:-1]."""
    xx, yy = float(x @ x), float(y @ y)
    if kind == "performer-positive":
        return np.exp(w @ (x + y) - (xx + yy) / 2)
    if kind == "performer-hyperbolic":
        return np.cosh(w @ (x + y)) * np.exp(-(xx + yy) / 2)
    if kind == "performer-trig":
        return np.cos(w @ (x - y)) * np.exp((xx + yy) / 2)
    raise ValueError(f"unknown random-feature kind {kind!r}; known: {', '.join(KINDS)}")


def kernel_estimates(kind: str, x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """K_hat(x, y) = phi(x).phi(y) per replicate: the mean of h over the m rows."""
    return row_terms(kind, x, y, w).mean(axis=-1)
