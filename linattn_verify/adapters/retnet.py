"""yet-another-retnet 0.5.1: retention (Sun et al. 2023, "Retentive Network", eq. 5-7) in its
parallel and chunkwise forms, functions of yet_another_retnet.retention (its token-by-token
retention_recurrent is the chunkwise one at chunks of 1).

They compute o_i = sum_{j<=i} gamma_h^(i-j) (q_i . k_j / sqrt(d)) v_j, unnormalised (the
group norm and gate of MultiScaleRetention are outside them), (B, H, N, d) in and out.
The library fixes gamma per head (_build_decay_gammas: 1 - exp(linspace(ln 1/32, ln 1/512,
H))); the adapters take the suite's gamma and put it in that one place for the call (the
cached decay mask cleared before and after), so every other line is the library's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from types import ModuleType

import torch

from ..specs import RSQRT_D, Spec
from .base import Adapter, Fn, import_library

INSTALL = "yet-another-retnet==0.5.1 einops"
SPEC = Spec("identity", causal=True, normalize=False, scale=RSQRT_D, decay="constant")
CHUNK = 32  # tokens per call of retention_chunkwise
_NOTE = (
    "Retention: sim = q . k / sqrt(d) (the library divides k by sqrt(d)) times gamma^(i-j), "
    "no normaliser: the identity spec, unnormalised, scale d^-0.5, constant decay. gamma is "
    "fixed by the library per head; the adapter substitutes the suite's for the call."
)


def _library() -> ModuleType:
    # the package runs `git describe` at import unless its version is given
    os.environ.setdefault("YET_ANOTHER_RETNET_VERSION", "0.5.1")
    return import_library("yet_another_retnet.retention", INSTALL)


@contextlib.contextmanager
def _gammas(retention: ModuleType, gamma: torch.Tensor) -> Iterator[None]:
    """The library's gammas are `gamma` in the block (its decay mask cache cleared)."""
    original = retention._build_decay_gammas
    retention._build_decay_mask.cache_clear()
    retention._build_decay_gammas = lambda num_heads, device=None, dtype=None: gamma.to(
        device=device, dtype=dtype
    )
    try:
        yield
    finally:
        retention._build_decay_gammas = original
        retention._build_decay_mask.cache_clear()


def _load(form: str) -> Callable[[], Fn]:
    def load() -> Fn:
        retention = _library()

        def parallel(q, k, v, gamma):
            with _gammas(retention, gamma):
                return retention.retention_parallel(q, k, v)[0]

        def chunkwise(q, k, v, gamma, initial_state=None):
            """(out, S): the library's state is S / sqrt(d) (it divides k by sqrt(d)),
            translated to and from the suite's S."""
            root = q.shape[-1] ** 0.5
            state, out = None if initial_state is None else initial_state / root, []
            with _gammas(retention, gamma):
                for start in range(0, q.shape[2], CHUNK):
                    piece = (t[:, :, start : start + CHUNK] for t in (q, k, v))
                    o, state = retention.retention_chunkwise(*piece, state)
                    out.append(o)
            return torch.cat(out, dim=2), state * root

        if form == "parallel":
            return parallel
        if form == "chunkwise-state":
            return chunkwise
        return lambda q, k, v, gamma: chunkwise(q, k, v, gamma)[0]

    return load


ADAPTERS = (
    Adapter("retnet.parallel", "yet-another-retnet", "yet_another_retnet.retention."
            "retention_parallel", SPEC, "bhnd", _NOTE + " Quadratic form, in the input dtype.",
            _load("parallel"), INSTALL, cost="quadratic"),
    Adapter("retnet.chunkwise", "yet-another-retnet", "yet_another_retnet.retention."
            "retention_chunkwise", SPEC, "bhnd", _NOTE + f" Chunks of {CHUNK} tokens, its "
            "state carried from chunk to chunk (with --state: its S / sqrt(d) translated to "
            "and from S).", _load("chunkwise"), INSTALL, state="S",
            load_state=_load("chunkwise-state")),
)  # fmt: skip
