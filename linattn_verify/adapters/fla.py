"""fla-core 0.6.0 (flash-linear-attention): the pure-PyTorch naive.py files, loaded on their
own without triton, and the Triton kernels (natively on CUDA, else in Triton's interpreter).

fla_loading.py loads them; fla_kernelised.py adapts linear_attn, simple_gla, gla, retention
and based (and says what is left out), fla_delta.py the delta rule's delta_rule,
gated_delta_rule and kda, fla_iplr.py generalized_delta_rule/iplr.
"""

from __future__ import annotations

from . import fla_delta, fla_iplr, fla_kernelised

ADAPTERS = (*fla_kernelised.ADAPTERS, *fla_delta.ADAPTERS, *fla_iplr.ADAPTERS)
