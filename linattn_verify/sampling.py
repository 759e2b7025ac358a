"""Projection matrices W (m, d) for the Performer feature maps, drawn from explicit seeds.

- iid: rows i.i.d. N(0, I_d). Unbiased (Choromanski et al. 2021, Lemma 1).
- orthogonal: blocks of d mutually orthogonal rows (QR of a Gaussian d x d block, signs
  fixed so the block is Haar-distributed, Mezzadri 2007), rows rescaled to chi(d)-distributed
  norms so each row is marginally N(0, I_d); blocks stacked until m rows (m may exceed d).
  Unbiased, lower MSE (Choromanski et al. 2021, Theorem 2).
- orthogonal-fixed-norm: orthogonal rows all of norm sqrt(d) (the "regularized" variant of
  Choromanski et al. 2021, sec. 4); rows are no longer Gaussian, so the estimator is biased.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .specs import SpecError


@dataclass(frozen=True)
class Sampler:
    name: str
    unbiased: bool
    draw: Callable[[int, int, np.random.Generator], np.ndarray]


def _iid(m: int, d: int, rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((m, d))


def _orthogonal_directions(m: int, d: int, rng: np.random.Generator) -> np.ndarray:
    """m rows from ceil(m / d) Haar-orthogonal d x d blocks (rows of Q, signs fixed)."""
    qmat, rmat = np.linalg.qr(rng.standard_normal((-(-m // d), d, d)))
    blocks = np.swapaxes(qmat * np.sign(np.diagonal(rmat, axis1=1, axis2=2))[:, None, :], 1, 2)
    return blocks.reshape(-1, d)[:m]


def _orthogonal(m: int, d: int, rng: np.random.Generator) -> np.ndarray:
    directions = _orthogonal_directions(m, d, rng)
    norms = np.sqrt(rng.chisquare(d, size=m))
    return directions * norms[:, None]


def _orthogonal_fixed_norm(m: int, d: int, rng: np.random.Generator) -> np.ndarray:
    return _orthogonal_directions(m, d, rng) * np.sqrt(d)


SAMPLERS: dict[str, Sampler] = {
    s.name: s
    for s in (
        Sampler("iid", True, _iid),
        Sampler("orthogonal", True, _orthogonal),
        Sampler("orthogonal-fixed-norm", False, _orthogonal_fixed_norm),
    )
}


def sample_projection(m: int, d: int, kind: str = "iid", seed: int = 0) -> np.ndarray:
    """W of shape (m, d), float64, drawn by sampler `kind` from numpy's PCG64(seed)."""
    if kind not in SAMPLERS:
        raise SpecError(f"unknown projection sampler {kind!r}; known: {', '.join(SAMPLERS)}")
    if not (isinstance(m, int) and isinstance(d, int) and m >= 1 and d >= 1):
        raise SpecError(f"m and d must be positive integers, got m={m!r}, d={d!r}")
    return SAMPLERS[kind].draw(m, d, np.random.default_rng(seed))
