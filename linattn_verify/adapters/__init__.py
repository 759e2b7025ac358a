"""Third-party linear-attention libraries behind the project's calling contract.

    out = fn(q, k, v)                  # q, k: (B, H, N, d), v: (B, H, N, dv)
    out = fn(q, k, v, projection=W)    # Performer specs: W is (m, d)

or the same in (B, N, H, d) where an adapter declares layout "bnhd" (docs/contract.md,
"The call"). An adapter translates calling conventions and layouts and
nothing more: the library's eps, scaling, normalisation, feature-map details and dtype
handling are its own. `spec` is what the library claims to compute, in our vocabulary
(specs.py); `note` says where the library departs from it or what it leaves out. The checks
judge the rest; expected.txt holds what vet finds (expected.py reads it).

Libraries are imported by `load()`, never at import time. Install them with
`pip install --no-deps ...` (Adapter.install) so that pip never replaces the installed
torch build. One module a library, but fla: fla.py gathers fla_kernelised.py and
fla_delta.py, which load fla through fla_loading.py.
"""

from __future__ import annotations

from . import fast_transformers, fla, linear_attention_transformer, performer, retnet, taylor_series
from .base import Adapter, AdapterUnavailable, relu_features

_ALL = (
    *performer.ADAPTERS,
    *fast_transformers.ADAPTERS,
    *fla.ADAPTERS,
    *linear_attention_transformer.ADAPTERS,
    *taylor_series.ADAPTERS,
    *retnet.ADAPTERS,
)
ADAPTERS: dict[str, Adapter] = {adapter.name: adapter for adapter in _ALL}
if len(ADAPTERS) != len(_ALL):
    raise AssertionError("adapter names must be unique")

__all__ = ["ADAPTERS", "Adapter", "AdapterUnavailable", "relu_features"]
