"""The options that declare what an implementation claims (docs/contract.md), one Option
each: its keyword, its command-line flag, its type, default, allowed values and help. The
commands' arguments, the pytest plugin's options, assert_linear_attention's keywords and
the reproduce commands' words all come from these records."""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..families.registry import NAMED, family_of
from ..implementations.forms import DEFAULT_CHUNK, FORMS
from ..specs import DECAYS, FEATURE_MAPS, QK_L2NORM_EPS, RSQRT_D, Spec, SpecError

LAYOUTS = ("bhnd", "bnhd")
# the carried state fn takes and returns with --state (docs/contract.md, "Carried state"):
# the pair (S, z) for a normalised spec (a state without z could not continue its
# normaliser), S alone for an unnormalised one
STATE_LAYOUTS = ("Sz", "S")
DECLARED = "declared"  # --state without a layout: an adapter's or a built-in form's own
COSTS = ("linear", "quadratic")
TRITON_BACKENDS = ("interpret",)  # --triton: Triton's interpreter on CPU tensors
SPEC_FIELDS = tuple(f.name for f in fields(Spec))  # the options that make up the spec


@dataclass(frozen=True)
class Option:
    """One option. name: its keyword (and dest); flag: its command-line spelling, for a
    bool the flag that sets it to `not default`; type: its Python type (float admits an
    int); choices: the strings it admits; const: its value when the flag is given alone;
    check(value, label): a further problem with a value, or None."""

    name: str
    flag: str
    type: Any
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    const: str | None = None
    check: Callable[[Any, str], str | None] | None = None

    def arguments(self) -> dict[str, Any]:
        """Keyword arguments of argparse's add_argument and pytest's addoption: values stay
        text, which `checked` parses (one error message for every entry point)."""
        kwargs = {"dest": self.name, "default": self.default, "help": self.help}
        if self.type is bool:
            return kwargs | {"action": "store_false" if self.default else "store_true"}
        if self.metavar or self.choices:
            kwargs["metavar"] = self.metavar or "{" + ",".join(self.choices) + "}"
        return kwargs | ({"nargs": "?", "const": self.const} if self.const else {})

    def words(self, value: Any) -> list[str]:
        """The command-line words that give `value` (none for the default)."""
        if value == self.default:
            return []
        return [self.flag] if self.type is bool or value == self.const else [self.flag, str(value)]

    def parse(self, text: str) -> Any:
        """The value a command line's text gives (itself when a string is admitted)."""
        if not self.admits(text):
            for kind in (int, float):
                if kind in _types(self.type):
                    try:
                        return kind(text)
                    except ValueError:
                        break
        return text  # when not admitted, `problem` names it

    def admits(self, value: Any) -> bool:
        """Whether `value` is of the option's type (a string: one of its choices)."""
        kinds = _types(self.type)
        if isinstance(value, str):
            return (
                value in self.choices or value == self.const or (not self.choices and str in kinds)
            )
        if isinstance(value, bool):  # an int to Python, not a number here
            return bool in kinds
        if value is None:
            return type(None) in kinds
        return (isinstance(value, int) and int in kinds) or (
            isinstance(value, int | float) and float in kinds
        )

    def problem(self, value: Any, label: str) -> str | None:
        """What is wrong with `value` (label: how the caller spells the option), or None."""
        if not self.admits(value):
            names = {bool: "True or False", int: "an integer", float: "a number"}
            what = [names[k] for k in _types(self.type) if k in names]
            if self.choices:
                one = "one of " * (len(self.choices) > 1) + ", ".join(self.choices)
                what.append(one)
            return f"{label} must be {' or '.join(what)}, got {value!r}"
        return self.check(value, label) if self.check else None


def checked(
    options: Iterable[Option], given: Mapping[str, Any], from_text: bool = False
) -> dict[str, Any]:
    """Each option's value in `given`, its default when absent or None; text from a command
    line (from_text) parsed. SpecError names the first that does not fit, by its flag when
    from_text, else by its keyword. A default is not checked."""
    values = {}
    for option in options:
        value = given.get(option.name)
        if value is None:
            value = option.default
        elif from_text and isinstance(value, str):
            value = option.parse(value)
        if value != option.default or type(value) is not type(option.default):
            label = option.flag if from_text else option.name
            if problem := option.problem(value, label):
                raise SpecError(problem)
        values[option.name] = value
    return values


def words(options: Iterable[Option], values: Mapping[str, Any]) -> list[str]:
    """The command-line words that give `values` (absent ones: the defaults)."""
    return [w for o in options for w in o.words(values.get(o.name, o.default))]


def _types(annotation: Any) -> tuple[Any, ...]:
    return annotation.__args__ if isinstance(annotation, types.UnionType) else (annotation,)


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
    Option("delta_rule", "--delta-rule", bool, False,
           "the state follows the delta rule (DeltaNet; with --decay gates Gated DeltaNet, "
           "with --decay channel-gates KDA): fn(q, k, v, beta=(B, H, N)[, g=...]), S_t = (I - "
           "beta_t k_t k_t^T) diag(exp(g_t)) S_(t-1) + beta_t k_t v_t^T, o_t = C S_t^T q_t; "
           "with --causal --feature-map identity --no-normalize"),
    Option("qk_l2norm", "--qk-l2norm", bool, False,
           f"with --delta-rule: fn normalises q and k itself, x / sqrt(|x|^2 + "
           f"{QK_L2NORM_EPS:g}) (fla's use_qk_l2norm_in_kernel); without it k is used as given"),
    Option("value_heads", "--value-heads", int, 1,
           "with --delta-rule: fn also takes G times as many value heads as query and key "
           "heads (fla's grouped value heads, HV = G H): v, beta, g and the output of HV "
           "heads, head hv reading q and k of head hv // G; every other check calls it with "
           "HV = H (default 1: not declared)", metavar="G"),
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
    Option("varlen", "--varlen", bool, False,
           "fn also takes a packed batch, fn(q, k, v, cu_seqlens=OFFSETS) with B = 1 "
           "(docs/contract.md, 'Packed batches')"),
    Option("triton", "--triton", str | None, None,
           "fn's Triton kernels run in Triton's interpreter on CPU tensors (TRITON_INTERPRET=1 "
           "set before triton is imported), their inputs and allocations in NaN guard bands "
           "(docs/triton.md); automatic for a Triton adapter when torch sees no CUDA device",
           choices=TRITON_BACKENDS),
    Option("tf32", "--tf32", bool, False,
           "with --triton interpret: float32 tl.dot inputs rounded to TF32 (a 10-bit "
           "mantissa), as an Ampere-or-newer GPU computes them by default"),
)  # fmt: skip
