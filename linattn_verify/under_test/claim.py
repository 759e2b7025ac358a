"""The options that declare what an implementation claims (docs/contract.md), one Option
each: its keyword, its command-line flag, its type, default, allowed values and help. The
commands' arguments, the pytest plugin's options, assert_linear_attention's keywords and
the reproduce commands' words all come from these records."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from ..families.registry import FAMILIES, NAMED, family_of
from ..grammar import Option
from ..implementations.forms import DEFAULT_CHUNK, FORMS
from ..specs import DECAYS, FEATURE_MAPS, RSQRT_D, Spec

LAYOUTS = ("bhnd", "bnhd")
# the carried state fn takes and returns with --state (docs/contract.md, "Carried state"):
# the pair (S, z) for a normalised spec (a state without z could not continue its
# normaliser), S alone for an unnormalised one
STATE_LAYOUTS = ("Sz", "S")
DECLARED = "declared"  # --state without a layout: an adapter's or a built-in form's own
COSTS = ("linear", "quadratic")
TRITON_BACKENDS = ("interpret",)  # --triton: Triton's interpreter on CPU tensors
SPEC_FIELDS = tuple(f.name for f in fields(Spec))  # the options that make up the spec


def default_cost(spec: Spec, form: str | None = None) -> str:
    """The growth an implementation claims unless it declares one: quadratic for softmax
    (no finite feature map) and for the built-in quadratic form, linear otherwise."""
    return "quadratic" if family_of(spec).quadratic or form == "quadratic" else "linear"


def state_layout(spec: Spec) -> str:
    """The layout of a spec's carried state: (S, z) when normalised, S alone otherwise."""
    return "Sz" if spec.normalize else "S"


def _positive(value: int, label: str) -> str | None:
    return f"{label} must be a positive integer, got {value}" if value < 1 else None


# what names a built-in form instead of a target
SOURCE = (
    Option(
        "form", "--form", str | None, None,
        "a built-in form of lv.attention, when no target is given (default: linear, or "
        "chunked for a causal spec)",
        choices=FORMS,
    ),
    Option("chunk_size", "--chunk-size", int | None, None,
           f"the chunked form's chunk (default {DEFAULT_CHUNK})", metavar="C",
           check=_positive),
)  # fmt: skip


def _named_family(value: Any, label: str) -> str | None:
    """Why `value` names no family of the registry's NAMED, or None."""
    if value is None or value in NAMED:
        return None
    return f"{label} names no family chosen by name ({', '.join(NAMED) or 'none yet'})"


# the spec (specs.Spec's fields) and the calling contract an implementation claims
CLAIM = (
    Option(
        "feature_map", "--feature-map", str | None, None,
        "the spec fn claims; required for a module:fn or path.py:fn target and a --form (an "
        "adapter claims its own): " + ", ".join(FEATURE_MAPS),
        choices=tuple(FEATURE_MAPS), metavar="NAME",
    ),
    Option("causal", "--causal", bool, False,
           "the claimed spec is causal: key j is used by query i iff j <= i"),
    Option("eps", "--eps", float, 0.0,
           "the denominator eps it claims: out_i = N_i / (eps + D_i) (default 0)", metavar="E"),
    Option("normalize", "--no-normalize", bool, True,
           "the claimed spec is unnormalised: out_i = sum_j sim(q_i, k_j) v_j (default: "
           "normalised, divided by eps + sum_j sim(q_i, k_j))"),
    Option("scale", "--scale", float | str, 1.0,
           f"every similarity times C: a number or {RSQRT_D} (1/sqrt(d), fla's default); "
           "default 1",
           choices=(RSQRT_D,), metavar="C"),
    Option(
        "decay", "--decay", str | None, None,
        "causal decay: constant (fn takes gamma=(H,), sim times gamma^(i-j)), gates (fn "
        "takes log-gates g=(B, H, N), sim times exp(g_(j+1) + ... + g_i)) or channel-gates "
        "(GLA: g=(B, H, N, d), feature m times exp(g_(j+1)m + ... + g_im); identity, elu, "
        "relu)",
        choices=DECAYS,
    ),
    Option("dot_precision", "--dot-precision", str | None, None,
           "its float32 products are TF32 by design (tf32: inputs rounded to a 10-bit "
           "mantissa): float32 outputs are bounded and budgeted in TF32's unit, 2^-11",
           choices=("tf32",)),
    *dict.fromkeys(option for family in FAMILIES for option in family.options),  # once each
    Option("family", "--family", str | None, None,
           "the spec family it computes, by name, where the options above do not state it: "
           + (", ".join(NAMED) or "none yet") + " (docs/architecture.md, 'Families')",
           choices=tuple(NAMED), metavar="NAME", check=_named_family),
    Option("layout", "--layout", str, "bhnd",
           "the layout fn takes and returns: bhnd (B, H, N, d; the default) or bnhd",
           choices=LAYOUTS),
    Option("cost", "--cost", str | None, None,
           "the growth it claims (default: quadratic for softmax and the quadratic form, "
           "else linear)",
           choices=COSTS),
    Option(
        "state", "--state", str | None, None,
        "fn(q, k, v, initial_state=STATE) returns (out, final_state): S (the state S, (B, "
        "H, F, dv)) or Sz (the pair (S, z), z (B, H, F)); an adapter or a built-in form: "
        "--state alone (docs/contract.md, 'Carried state')",
        choices=STATE_LAYOUTS, metavar="LAYOUT", const=DECLARED,
    ),
    Option(
        "step", "--step", str | None, None,
        "fn is a serving step kernel: fn(q, k, v, cache=CACHE, slots=SLOTS) with one token "
        "per request returns the outputs (B, H, 1, dv) and writes each request's state into "
        "its slot of CACHE in place; LAYOUT as --state's, a slot each (docs/contract.md, "
        "'Step kernels')",
        choices=STATE_LAYOUTS, metavar="LAYOUT",
    ),
    Option("varlen", "--varlen", bool, False,
           "fn also takes a packed batch, fn(q, k, v, cu_seqlens=OFFSETS) with B = 1 "
           "(docs/contract.md, 'Packed batches')"),
    Option("max_head_dim", "--max-head-dim", int | None, None,
           "the largest head dimension d of q and k it takes (dv is not bounded): vet "
           "judges d <= D alone, every check there, and says in one line what a call at "
           "d = D + 1 does (docs/contract.md, 'Declared limits')", metavar="D",
           check=_positive),
    Option("even_dims_backward", "--even-dims-backward", bool, False,
           "its backward takes even d and dv alone in float16 and bfloat16 (as fla's "
           "chunk kernels assert): vet's gradient checks use even ones there, and say in "
           "one line what a 16-bit backward with an odd dv does (docs/contract.md, "
           "'Declared limits')"),
    Option("triton", "--triton", str | None, None,
           "fn's Triton kernels run in Triton's interpreter on CPU tensors (TRITON_INTERPRET=1 "
           "set before triton is imported), their inputs and allocations in NaN guard bands "
           "(docs/triton.md); automatic for a Triton adapter when torch sees no CUDA device",
           choices=TRITON_BACKENDS),
    Option("tf32", "--tf32", bool, False,
           "with --triton interpret: float32 tl.dot inputs rounded to TF32 (a 10-bit "
           "mantissa), as an Ampere-or-newer GPU computes them by default"),
)  # fmt: skip
