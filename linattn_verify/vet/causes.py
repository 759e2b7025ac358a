"""The cause of a failure, named where it can be shown: the failing element, re-evaluated the
way a suspected evaluation computes it, fails the same way there. Failures that one cause
explains, in any check and any dtype, are one finding (findings.py).

A row judged against the exact reference carries its worst element: the case, the index
(b, h, i, c), the output and the exact value (checks/agreement.py). The element depends on
q_i, the keys k_j it attends to and their values v_jc; each namer below rebuilds them
(Case.tensors), evaluates the features the suspected way in each precision, finest first
(COMPUTE_DTYPES), and the rest in float64, so that only the features can fail:

- elu, 0/0 where the exact value is finite:
  - "elu-underflow": e^x underflows float64 (x below ln of its smallest subnormal, -744):
    only an evaluation that shifts each row by its largest coordinate, e^(x - max x),
    keeps such rows (the golden one does; regimes.py: elu's negative rows reach -1e6);
  - "elu-expm1": F.elu(x) + 1 = expm1(x) + 1 is exactly 0 once e^x is under the unit
    roundoff u of the precision it is computed in (between ln(u/2) and ln u, by how the
    library rounds expm1; at ln u whatever it does): the finest precision in which the
    element's denominator vanishes is named, with ln u, where the cancellation starts;
- elu, within the bound and over the budget: "elu-expm1" again: its error is absolute (u)
  where the golden one's is relative (families/kernelised/bound.py), which costs
  accuracy in rows whose every coordinate is below regimes.ELU_ROW_FLOOR = -ln K_BUDGET
  (features under 1 / K_BUDGET): named when the expm1(x) + 1 evaluation alone exceeds the
  budget there, by an error within a factor EXPLAINS of the kernel's;
- softmax and the positive Performer maps, a non-finite output where the exact value is
  finite: "exp-overflow" (an unshifted exponent beyond ln of the precision's largest value)
  or "exp-underflow" (every weight phi(q_i) . phi(k_j) below its smallest subnormal), in the
  finest precision in which the unshifted evaluation (features and their products in it)
  fails there;
- relu, a number where the exact value is 0/0: "relu-zero": relu(q_i) . relu(k_j) is
  exactly 0 for every key, so the output must be NaN (a kernel that adds an eps to its
  denominator declares it).

Any spec, first: "tf32-products", a float32 forward row (reference, associativity, decay,
accuracy) over its budget whose error is within EXPLAINS of the golden forms' on q, k, v
rounded to TF32, itself over the budget, where TF32 products ran: a tl.dot that Triton's
interpreter ran on float32 inputs with TF32 products in that check (its figure
"tf32_dots"), or a CUDA device, where a compiled tl.dot takes them so by default (not
observed there). A kernel without one (elementwise products, a float16 state erring alike)
is never told to declare TF32 (--dot-precision tf32).

Any spec, then: "narrowed", a forward row over its budget where Triton's interpreter ran
float casts to a precision coarser than the case's in that check (its figure "narrowed":
the source lines), whose error that precision's rounding explains: a float16 state in a
float32 call, float32 arithmetic in a float64 one. Named with the lines; no option is
advised (a kernel that rounds below its inputs' precision is judged in theirs).

A spec whose family takes Spec.stored (the delta rule) and does not declare it:
"stored-intermediates", a float16 or bfloat16 forward or gradient row over its budget and
within the a-priori bound, where Triton's interpreter saw the kernel store values narrowed
from float32 to the case's dtype into tensors that later launches read back while they
live (its figure "stored": the storing lines and the tensors' argument names), and whose
error the golden that rounds what such a kernel stores (families/delta/golden.py,
golden_delta_stored) explains: within EXPLAINS of that golden's error, and within the budget
it sets. Advised: --stored input-dtype, the design declared.

Anything else is not named: its failures are grouped by their inputs (findings.py). Only
normalised specs without a decay or an eps, with IEEE products, get the feature namers above
(the re-evaluation is theirs).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..accuracy.judgement import Judgement
from ..accuracy.verdict import K_BUDGET, percent
from ..cases import Case
from ..checks.decay import judged_case
from ..checks.gradients import stored_design
from ..families import case_arguments, family_of, golden_attention, golden_forms
from ..inputs import SMALLEST_SUBNORMAL, UNIT_ROUNDOFF, round_to_tf32
from ..regimes import ELU_ROW_FLOOR
from ..specs import Spec
from ..triton_interpret import MANTISSA_BITS

Row = dict[str, Any]

COMPUTE_DTYPES = ("float64", "float32", "float16", "bfloat16")  # finest unit roundoff first
# A re-evaluation explains a kernel's error when its own error is within this factor of it,
# either way (the kernel's other roundings move it by far less; another bug, by far more).
EXPLAINS = 8.0


@dataclass(frozen=True)
class Cause:
    """A named cause on one failing row: `key` is the cause (the rows it names, of every check
    and dtype, are one finding), `effect` what it does there ("nan", "not nan", "inaccurate")
    in the precision `compute` that shows it; `short` says it in one line with where it
    starts, `detail` how it comes about on this row's element; `figures` carry the
    threshold, the precision and the element; `advice`, the claim's option its words
    suggest where the kernel does so by design (vet's words, e.g. ("--eps", "1e-06"))."""

    key: str
    effect: str
    compute: str
    short: str
    detail: str
    figures: dict[str, Any] = field(default_factory=dict)
    advice: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class _Element:
    """The worst element of a failed row and what it depends on, in the case's dtype."""

    spec: Spec
    case: Case
    index: tuple[int, int, int, int]
    q: torch.Tensor  # q_i (d,)
    k: torch.Tensor  # the keys it attends to (J, d)
    v: np.ndarray  # their values v_jc (J,), float64
    w: torch.Tensor | None  # the projection (m, d) of the Performer maps
    output: float
    exact: float | None  # None: not known (a check that does not compute it); NaN: 0/0
    error: float  # the kernel's error there, in units of u s
    budget: float | None

    @property
    def q_name(self) -> str:
        b, h, i, _ = self.index
        return f"q[{b}, {h}, {i}] = {_coordinates(self.q)}"

    @property
    def keys_name(self) -> str:
        b, h, i, _ = self.index
        last = self.k.shape[0] - 1
        return (
            f"the keys k[{b}, {h}, j], j <= {last}"
            if last != i
            else f"the keys k[{b}, {h}, j <= {i}]"
        )

    def weighted(self, fq: torch.Tensor, fk: torch.Tensor, products: str | None = None) -> float:
        """sum_j a_j v_j / sum_j a_j with a_j = fq . fk_j, the features given, in float64
        (each product fq_l fk_jl rounded to the dtype `products` first, if given)."""
        terms = fk.double() * fq.double()
        if products is not None:
            terms = terms.to(getattr(torch, products)).double()
        a = terms.sum(dim=1).numpy()
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return float((a @ self.v) / a.sum())

    def units(self, value: float, log_weights: np.ndarray) -> float:
        """|value - exact| in units of u s of the case's dtype, s = sum_j a_j |v_j| / sum_j
        a_j from the exact weights (their logs given, any common shift)."""
        a = np.exp(log_weights - log_weights.max())
        s = float(a @ np.abs(self.v) / a.sum())
        diff = abs(value - self.exact)
        return diff / (UNIT_ROUNDOFF[self.case.dtype] * s) if diff else 0.0


def _coordinates(x: torch.Tensor) -> str:
    return "[" + ", ".join(f"{float(t):.3g}" for t in x.reshape(-1)) + "]"


def _value(x: float) -> str:
    return "NaN" if math.isnan(x) else f"{x:.3g}"


def _got(el: _Element) -> str:
    """The output against the exact value, in words."""
    exact = "finite" if el.exact is None else f"{el.exact:.3g}"
    return f"{_value(el.output)} where the exact value is {exact}"


def _logsumexp(a: np.ndarray, axis: int) -> np.ndarray:
    top = a.max(axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return np.log(np.exp(a - top).sum(axis=axis)) + top.squeeze(axis)


# --- elu ------------------------------------------------------------------------------------


def _elu_expm1(x: torch.Tensor, dtype: str) -> torch.Tensor:
    """F.elu(x) + 1 computed in `dtype`: expm1(x) + 1 for x < 0."""
    return F.elu(x.to(getattr(torch, dtype))) + 1


def _elu_exp(x: torch.Tensor) -> torch.Tensor:
    """exp(x) for x <= 0 and x + 1 above, in float64, unshifted."""
    x = x.double()
    return torch.where(x > 0, x + 1, torch.exp(torch.clamp(x, max=0.0)))


def _elu_log_weights(el: _Element) -> np.ndarray:
    """ln a_j of the exact weights a_j = phi(q) . phi(k_j), phi(x) = e^x below 0, x + 1 above."""
    q, k = el.q.double().numpy(), el.k.double().numpy()
    lq = np.where(q > 0, np.log1p(np.maximum(q, 0)), q)
    lk = np.where(k > 0, np.log1p(np.maximum(k, 0)), k)
    return _logsumexp(lq[None, :] + lk, axis=1)


def _vanishing(el: _Element, fq: torch.Tensor, fk: torch.Tensor, below: str) -> str:
    """Which features make the element's denominator vanish, in words."""
    if bool((fq == 0).all()):
        return f"every coordinate of {el.q_name} is {below}"
    if bool((fk == 0).all()):
        top = float(el.k.double().max())
        return f"every coordinate of {el.keys_name} is {below} (the largest is {top:.3g})"
    return f"each product phi(q_il) phi(k_jl) of {el.q_name} and its keys has a factor {below}"


def _elu(el: _Element) -> Cause | None:
    if el.exact is not None and not math.isfinite(el.exact):
        return None
    if not math.isfinite(el.output):
        floor = math.log(SMALLEST_SUBNORMAL["float64"])
        fq, fk = _elu_exp(el.q), _elu_exp(el.k)
        if not math.isfinite(el.weighted(fq, fk)):
            where = _vanishing(el, fq, fk, f"below {floor:.4g}")
            return Cause(
                "elu-underflow",
                "nan",
                "float64",
                f"elu features e^x underflow for rows below x = {floor:.4g} (even in float64): "
                + _got(el),
                f"{where}: unshifted, its features are 0 and the output 0/0; shifted by the row's "
                "largest coordinate, e^(x - max x) e^(max x), they are not",
                {"threshold": floor, "output": el.output, "exact": el.exact},
            )
        for dtype in COMPUTE_DTYPES:
            fq, fk = _elu_expm1(el.q, dtype), _elu_expm1(el.k, dtype)
            if math.isfinite(el.weighted(fq, fk)):
                continue
            start = math.log(UNIT_ROUNDOFF[dtype])
            where = _vanishing(el, fq, fk, "below it")
            return Cause(
                "elu-expm1",
                "nan",
                dtype,
                f"elu(x) + 1 cancels for rows below x = {start:.3g} in {dtype}: " + _got(el),
                f"computed as expm1(x) + 1 it is 0 once e^x < u ({start:.3g} = ln u); {where}, "
                "so 0/0",
                {"threshold": start, "output": el.output, "exact": el.exact},
            )
        return None
    if el.exact is None or el.budget is None or not el.error > el.budget:
        return None
    log_weights = _elu_log_weights(el)
    for dtype in COMPUTE_DTYPES:
        units = el.units(el.weighted(_elu_expm1(el.q, dtype), _elu_expm1(el.k, dtype)), log_weights)
        if not units >= el.budget:
            continue
        if not el.error / EXPLAINS <= units <= el.error * EXPLAINS:
            return None  # the cancellation is there, but another error dominates
        if float(el.q.double().max()) < ELU_ROW_FLOOR:
            where = f"every coordinate of {el.q_name} is below it"
        elif float(el.k.double().max()) < ELU_ROW_FLOOR:
            where = f"every coordinate of {el.keys_name} is below it"
        else:
            return None
        share = el.error * UNIT_ROUNDOFF[el.case.dtype]
        return Cause(
            "elu-expm1",
            "inaccurate",
            dtype,
            f"elu(x) + 1 is inaccurate for rows below x = {ELU_ROW_FLOOR:.3g} in {dtype}: error "
            f"{percent(share)} of the output's scale, over the budget",
            f"computed as expm1(x) + 1 its error is u, absolute, and the features of such rows "
            f"are under 1/{K_BUDGET:g}; {where} ({el.error:.3g} u s; the expm1(x) + 1 "
            f"evaluation alone: {units:.3g}; budget {el.budget:.3g})",
            {"threshold": ELU_ROW_FLOOR, "error": el.error, "evaluation": units},
        )
    return None


# --- the exponential maps -------------------------------------------------------------------


def _exponents(el: _Element) -> tuple[np.ndarray, np.ndarray]:
    """The exponents of the query's and the keys' terms in float64: (m,) and (J, m) for the
    Performer maps (W x' - |x'|^2/2, x' = x d^(-1/4); +-W x' for the hyperbolic one); (1,)
    zeros and (J, 1) logits q.k / sqrt(d) for softmax."""
    q, k = el.q.double().numpy(), el.k.double().numpy()
    d = q.shape[0]
    if el.spec.feature_map == "softmax":
        return np.zeros(1), (k @ q / math.sqrt(d))[:, None]
    w = el.w.double().numpy()
    xq, xk = q * d**-0.25, k * d**-0.25
    pq, pk = w @ xq, xk @ w.T
    if el.spec.feature_map == "performer-hyperbolic":
        pq, pk = np.concatenate([pq, -pq]), np.concatenate([pk, -pk], axis=1)
    return pq - xq @ xq / 2, pk - (xk * xk).sum(axis=1, keepdims=True) / 2


def _exp(el: _Element) -> Cause | None:
    if (el.exact is not None and not math.isfinite(el.exact)) or math.isfinite(el.output):
        return None
    eq, ek = _exponents(el)
    for dtype in COMPUTE_DTYPES:
        t = getattr(torch, dtype)
        fq, fk = torch.exp(torch.from_numpy(eq).to(t)), torch.exp(torch.from_numpy(ek).to(t))
        if math.isfinite(el.weighted(fq, fk, products=dtype)):
            continue
        what = "exp(q.k / sqrt(d))" if el.spec.feature_map == "softmax" else "exp(W x' - |x'|^2/2)"
        if bool(torch.isinf(fq).any() or torch.isinf(fk).any()):
            top, edge = float(max(eq.max(), ek.max())), math.log(torch.finfo(t).max)
            who = (
                el.q_name
                if eq.max() >= ek.max() or el.spec.feature_map == "softmax"
                else (el.keys_name)
            )
            return Cause(
                "exp-overflow",
                "nan",
                dtype,
                f"{what} overflows {dtype} for exponents above {edge:.4g}: {_got(el)}",
                f"the largest exponent of {who} is {top:.4g}; unshifted (no largest exponent "
                "subtracted first), inf / inf",
                {"threshold": edge, "largest": top, "output": el.output, "exact": el.exact},
            )
        top = float(_logsumexp(eq[None, :] + ek, axis=1).max())
        edge = math.log(SMALLEST_SUBNORMAL[dtype])
        return Cause(
            "exp-underflow",
            "nan",
            dtype,
            f"{what} underflows {dtype} for weights below e^{edge:.4g}: {_got(el)}",
            f"every weight phi(q_i) . phi(k_j) of {el.q_name} is below it (the largest is "
            f"e^{top:.4g}); unshifted (no largest exponent subtracted first), 0/0",
            {"threshold": edge, "largest": top, "output": el.output, "exact": el.exact},
        )
    return None


# --- relu -----------------------------------------------------------------------------------


def _relu(el: _Element) -> Cause | None:
    if el.exact is None or not math.isnan(el.exact) or math.isnan(el.output):
        return None
    fq, fk = torch.relu(el.q.double()), torch.relu(el.k.double())
    if float((fk @ fq).sum()) != 0.0:
        return None
    if bool((fq == 0).all()):
        where = f"every coordinate of {el.q_name} is <= 0"
    else:
        where = f"no key it attends to has a positive coordinate where {el.q_name} has one"
    return Cause(
        "relu-zero",
        "not nan",
        "",  # in any precision
        "relu's denominator is exactly 0: the exact value is 0/0, the output "
        f"{_value(el.output)}, not NaN",
        f"{where}, so relu(q_i) . relu(k_j) = 0 for every key (a kernel that adds an eps to "
        "its denominator declares it: --eps)",
        {"output": el.output},
        ("--eps", "1e-06"),
    )


NAMERS: dict[str, Callable[[_Element], Cause | None]] = {
    "elu": _elu,
    "softmax": _exp,
    "performer-positive": _exp,
    "performer-hyperbolic": _exp,
    "relu": _relu,
}


def name_cause(row: Row, spec: Spec | None) -> Cause | None:
    """The named cause of a failed row (module docstring), or None."""
    figures = row.get("figures") or {}
    if spec is None or not row.get("case"):
        return None
    name = str(row.get("name", ""))
    forward = name in ("reference", "associativity", "decay") or name.startswith("accuracy ")
    if (
        forward
        and "max_error" in figures
        and (
            tf32 := _tf32(
                spec,
                row["case"],
                _float(figures["max_error"]),
                int(figures.get("tf32_dots") or 0),
                name == "decay",
                figures.get("ieee_products_pass"),
            )
        )
    ):
        return tf32
    if forward and (narrowed := _narrowed(spec, row["case"], figures, name == "decay")):
        return narrowed
    if (forward or name in STORED_GRADIENT_CHECKS) and (
        stored := _stored(spec, row["case"], forward, row.get("severity"), figures)
    ):
        return stored
    if spec.feature_map not in NAMERS or spec.dot_precision is not None:
        return None
    if family_of(spec).forgets(spec) or not spec.normalize or spec.eps:
        return None
    if figures.get("worst_index") is None or "worst_output" not in figures:
        return None
    exact = _float(figures["worst_exact"]) if "worst_exact" in figures else None
    return _named(
        spec,
        row["case"],
        tuple(figures["worst_index"]),
        _float(figures["worst_output"]),
        exact,
        _float(figures.get("max_error")),
        figures.get("budget"),
    )


TF32 = "tf32-products"  # the cause's key


@functools.lru_cache(maxsize=64)
def _tf32(
    spec: Spec, case_json: str, error: float, dots: int, decay_check: bool, ieee: bool | None
) -> Cause | None:
    """ "tf32-products": a float32 output of a spec with IEEE products, over its budget by an
    error within a factor EXPLAINS of the golden forms' on q, k, v rounded to TF32 (what
    tensor cores multiply; inputs.round_to_tf32), itself over the budget, where products of
    TF32 inputs ran: `dots`, the tl.dots that Triton's interpreter rounded so in this check
    (the figure "tf32_dots", checks/core.py), or a CUDA device (a compiled tl.dot's default, not
    observed). Elsewhere no product is TF32's, whatever the error's size: a float16 state
    errs alike; nor where the check failed again with the tl.dots' products IEEE (`ieee`
    False, the figure "ieee_products_pass"): then something else errs as much, and nothing
    is put down to TF32. decay_check: the case at the decay rate the decay check judged it
    at."""
    case = dataclasses.replace(Case.from_json(case_json), device="cpu")
    cuda = Case.from_json(case_json).device.startswith("cuda")
    if decay_check:
        case = judged_case(case)[1]
    if case.dtype != "float32" or spec.dot_precision is not None or not math.isfinite(error):
        return None
    if not (dots or cuda) or ieee is False:
        return None
    judgement = Judgement.of_case(case, spec)
    q, k, v, w, decay = case_arguments(case, spec)
    rounded = [round_to_tf32(t) for t in (q, k, v)]
    verdicts = [
        judgement(golden_attention(*rounded, spec, w, form, decay)) for form in golden_forms(spec)
    ]
    tf32 = max(v.max_error for v in verdicts)
    budget = judgement(judgement.golden[0]).budget  # the float32 budget of this case
    over = any(v.within_budget is False for v in verdicts)
    if not (budget and over and tf32 / EXPLAINS <= error <= tf32 * EXPLAINS):
        return None
    if dots:  # the interpreter's evidence: TF32 tl.dots ran, and IEEE ones pass (core.py)
        ran = f"{dots} tl.dot calls on float32 inputs ran with TF32 products"
        short = (
            "float32 errors of TF32 products (2^-11 per product; --dot-precision tf32 if by design)"
        )
        advice: tuple[str, ...] = ("--dot-precision", "tf32")
    else:  # on CUDA nothing here tells TF32 products from another rounding to 2^-11
        ran = (
            "on a CUDA device, where a compiled tl.dot takes float32 inputs as TF32 by default; "
            "no experiment here tells its products from another rounding to 2^-11 (a float16 "
            "state errs alike): Triton's interpreter (--triton interpret --tf32) can"
        )
        short = "float32 errors of the size of TF32 products' (2^-11), or of another rounding"
        advice = ()
    detail = (
        f"{ran}; its error, {error:.3g} u s, is within {EXPLAINS:g}x of the golden forms' on "
        f"q, k, v rounded to TF32 ({tf32:.3g} u s), against a float32 budget of {budget:.3g}"
    )
    return Cause(TF32, "inaccurate", "float32", short, detail, {"tf32_error": tf32}, advice)


NARROWED = "narrowed"  # the cause's key
SHOWN_LINES = 3  # the source lines a narrowed cause names


def _narrowed(spec: Spec, case_json: str, figures: dict[str, Any], decay_check: bool):
    """ "narrowed": a forward row over its budget where Triton's interpreter ran float casts
    to a precision coarser than the case's in this check (the figure "narrowed",
    checks/core.py: from, to, source line, count), and whose error is within a factor
    EXPLAINS, either way, of the golden forms' on q, k, v (and the decay) rounded to the
    coarsest precision cast to, their output rounded to it too: the size of that precision's
    rounding on this case. A cast whose rounding does not reach the output (a copy kept for
    another kernel) leaves the error far below; another bug, far above. A rounding the
    kernel does by design in its own dtype is not one: only casts below the case's
    precision count. Returns a Cause or None."""
    casts = figures.get("narrowed") or []
    error = _float(figures.get("max_error"))
    if not casts or not math.isfinite(error):
        return None
    dtype = Case.from_json(case_json).dtype
    given, target = min(((c[0], c[1]) for c in casts), key=lambda pair: MANTISSA_BITS[pair[1]])
    rounded = _rounded_golden_error(spec, case_json, target, decay_check)
    if not rounded / EXPLAINS <= error <= rounded * EXPLAINS:
        return None
    where = _lines([_source(c[2]) for c in casts if (c[0], c[1]) == (given, target)])
    short = f"{given} values rounded to {target} inside the kernel ({where})"
    detail = (
        f"a {dtype} call ran {sum(c[3] for c in casts)} casts to {target} in this check; its "
        f"error, {error:.3g} u s, is within {EXPLAINS:g}x of the golden forms' with q, k, v "
        f"and the output rounded to {target} ({rounded:.3g} u s)"
    )
    return Cause(NARROWED, "inaccurate", target, short, detail, {"narrowed_to": target})


@functools.lru_cache(maxsize=64)
def _rounded_golden_error(spec: Spec, case_json: str, target: str, decay_check: bool) -> float:
    """The largest error, in u s of the case's dtype, of the golden forms given q, k, v and
    the decay rounded to `target` (computing as they do for it, the output in it)."""
    case = dataclasses.replace(Case.from_json(case_json), device="cpu")
    if decay_check:
        case = judged_case(case)[1]
    judgement = Judgement.of_case(case, spec)
    q, k, v, w, decay = case_arguments(case, spec)
    low = getattr(torch, target)
    q_, k_, v_ = (t.to(low) for t in (q, k, v))
    decay_ = (
        decay.to(low) if isinstance(decay, torch.Tensor) and decay.is_floating_point() else decay
    )
    outputs = [golden_attention(q_, k_, v_, spec, w, form, decay_) for form in golden_forms(spec)]
    return max(judgement(out.to(q.dtype)).max_error for out in outputs)


STORED = "stored-intermediates"  # the cause's key
STORED_GRADIENT_CHECKS = ("gradient", "state-gradient")  # their rows carry stored_* figures


def _stored(
    spec: Spec, case_json: str, forward: bool, severity: str | None, figures: dict[str, Any]
) -> Cause | None:
    """ "stored-intermediates": a 16-bit row, over its budget and within the bound, of a spec
    whose family takes Spec.stored and that does not declare it, with the evidence that the
    kernel kept intermediates between its kernels in the case's dtype (the figure "stored",
    checks/core.py: narrowed stores into tensors later launches loaded), whose error the
    golden under that design explains: within a factor EXPLAINS of its error and within its
    budget, per gradient over budget (the gradient checks' stored_golden_dX and
    stored_budget_dX, checks/gradients.stored_figures) or for the output (the judgement of
    the spec declaring it)."""
    dtype = Case.from_json(case_json).dtype
    kept = [s for s in figures.get("stored") or [] if s[1] == dtype and s[0] == "float32"]
    declared = stored_design(spec)
    if not kept or declared is None or spec.stored is not None or severity == "wrong":
        return None
    if forward:
        found = _stored_forward(spec, declared, case_json, _float(figures.get("max_error")))
    else:
        found = _stored_gradients(figures)
    if found is None:
        return None
    design, what = found
    where = _lines([_source(s[2]) for s in kept])
    tensors = ", ".join(sorted({s[3] for s in kept}))
    short = (
        f"intermediates stored in {dtype} between kernels ({where}; --stored {declared} if by "
        "design)"
    )
    detail = (
        f"later kernels read back what these stores narrowed from float32 to "
        f"{dtype}: {tensors}; {what}, against the golden that rounds what such a kernel stores "
        f"(T, w, u, the chunk states, the new values and their cotangents): {design}"
    )
    return Cause(STORED, "inaccurate", dtype, short, detail, {"stored_in": dtype},
                 ("--stored", declared))  # fmt: skip


def _stored_forward(
    spec: Spec, declared: str, case_json: str, error: float
) -> tuple[str, str] | None:
    """(the rounded golden's figures, the row's, in words) where that golden explains a forward
    row's error, else None."""
    if not math.isfinite(error):
        return None
    design = dataclasses.replace(spec, stored=declared)
    case = dataclasses.replace(Case.from_json(case_json), device="cpu")
    judgement = Judgement.of_case(case, design)
    verdict = judgement(judgement.golden[0])
    golden, budget = verdict.max_error, verdict.budget
    if not (budget and golden / EXPLAINS <= error <= min(golden * EXPLAINS, budget)):
        return None
    return f"its error {golden:.3g} u s, its budget {budget:.3g}", f"its error, {error:.3g} u s"


def _stored_gradients(figures: dict[str, Any]) -> tuple[str, str] | None:
    """As _stored_forward, for the gradients over their budget (at least one)."""
    over = [
        name[len("max_error_d"):]
        for name, error in figures.items()
        if name.startswith("max_error_d")
        and error is not None
        and error > _float(figures.get("budget_d" + name[len("max_error_d"):]))
    ]  # fmt: skip
    if not over:
        return None
    rows, design = [], []
    for name in over:
        error = _float(figures[f"max_error_d{name}"])
        golden = _float(figures.get(f"stored_golden_d{name}"))
        budget = _float(figures.get(f"stored_budget_d{name}"))
        if not (golden / EXPLAINS <= error <= min(golden * EXPLAINS, budget)):
            return None
        rows.append(f"d{name} {error:.3g} u M")
        design.append(f"d{name} {golden:.3g} u M, budget {budget:.3g}")
    return "; ".join(design), "over the budget: " + ", ".join(rows)


def _lines(sources: list[str]) -> str:
    """Source lines "file:n", each file named once: "a.py:3, 4, b.py:9", the first
    SHOWN_LINES lines and how many more."""
    by_file: dict[str, list[int]] = {}
    for path, _, number in (s.rpartition(":") for s in sorted(set(sources))):
        by_file.setdefault(path, []).append(int(number) if number.isdigit() else 0)
    shown = [(path, n) for path, numbers in by_file.items() for n in sorted(numbers)]
    parts, previous = [], None
    for path, number in shown[:SHOWN_LINES]:
        parts.append(str(number) if path == previous else f"{path}:{number}")
        previous = path
    more = len(shown) - SHOWN_LINES
    return ", ".join(parts) + (f" and {more} more" if more > 0 else "")


def _source(line: str) -> str:
    """A kernel's source line, from its library's root (site-packages) or the working
    directory where it lies under either."""
    path, _, number = line.rpartition(":")
    for root in (*(p for p in sys.path if p.endswith("-packages")), os.getcwd()):
        if root and path.startswith(root.rstrip(os.sep) + os.sep):
            return f"{os.path.relpath(path, root)}:{number}"
    return line


def _float(x: Any) -> float:
    """A figure as a float; None (a non-finite figure read back from JSON) as NaN."""
    return math.nan if x is None else float(x)


@functools.lru_cache(maxsize=256)
def _named(spec, case_json, index, output, exact, error, budget) -> Cause | None:
    case = dataclasses.replace(Case.from_json(case_json), device="cpu")
    q, k, v, w = case.tensors()
    b, h, i, c = index
    keys = i + 1 if spec.causal else k.shape[2]
    el = _Element(
        spec, case, (b, h, i, c), q[b, h, i], k[b, h, :keys], v[b, h, :keys, c].double().numpy(),
        w, output, exact, error, budget,
    )  # fmt: skip
    return NAMERS[spec.feature_map](el)
