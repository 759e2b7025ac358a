"""The long-context check: the implementation at the lengths linear attention is for.

Every spec: plain, scaled, unnormalised, decayed and the delta rule. Per dtype, two panels:
B = H = 1 (a decayed spec: H = 2, one head per memory of MEMORIES), d = 16 at every length
up to the longest, and B = H = 2, d = 64 up to WIDE_LONGEST (a kernel's state is d x dv:
the wide panel's N is what a per-token cost of d^2 affords); each one input of the typical
regime at its longest length (q, k ~ N(0, 1) with the keys sharing a direction, values ~
N(1, 1): a mean, so that errors proportional to the output show; a decay at the rates of
MEMORIES, Family.long_arguments),
and its prefixes of `lengths` tokens. At each length:

- finiteness: a non-finite output where the exact one is finite is wrong;
- accuracy against the certified reference (reference/certified.py, certified_decay.py,
  the delta rule's delta.py): the a-priori bound at that N, the smaller of Higham's
  deterministic gamma_n and Higham & Mary's probabilistic one (accuracy/bound.py; the delta
  rule's own normwise bound, delta_bound.py; the deterministic one is vacuous past n u >=
  1, e.g. float16
  past N = 2048), with a false-failure probability of FALSE_FAILURE per case; and the
  budget, K_BUDGET times the golden implementation's error at the same N;
- for causal specs whose weights do not depend on N (all but cosFormer), prefix
  consistency: the first n rows of the longest run against the run of length n, within
  the two element budgets where a budget or a finite bound judges (implied by the accuracy
  of both in the rows the budget compares; it adds the rows left to a finite bound);
and over the lengths, growth: an error that grows faster with N than the golden's by
GROWTH_EXCESS in the log-log slope, and exceeds GROWTH_MARGIN times the golden's at the
longest N, is flagged (an error growing like n u where the golden's grows like sqrt(n) u).
A failure names the smallest N where it shows. float64 is judged against correctly rounded
references elsewhere (the certified one is within 2^-34 s, not 2^-53): not here.

What a length costs is predicted before it runs, from what the kernel's calls at the two
shortest lengths counted (scaling/cost.py: matmul FLOPs, peak live bytes, dispatched ops),
never from wall time, so that a verdict does not depend on how busy the machine is. A
length predicted past one of LIMITS is not run: where the counts grow faster than the
kernel's claimed linear cost, that is a cost finding (a kernel materialising N x N weights
stopped before it exhausts memory); where they grow linearly, the panel ends there and
the detail says so.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from .. import families
from ..accuracy.bound import (
    FEATURE_MODEL,
    denominator_condition,
    feature_model,
    gamma_probabilistic,
    probabilistic_lambda,
    scale_and_bound,
)
from ..accuracy.verdict import (
    attainable_floor,
    beyond_range,
    element_budgets,
    error_units,
    judge,
    rounded_to_inf,
)
from ..families import family_of, golden_attention, long_form, validate
from ..implementations.projection import sample_projection_torch
from ..inputs import SMALLEST_SUBNORMAL, unit_roundoff
from ..reference.certified import Certified
from ..reference.certified_engine import settle_rows
from ..results import CheckResult
from ..scaling.cost import Cost, counted
from ..scaling.growth import SLOPE_TOLERANCE
from ..specs import Spec
from ..triton_interpret import STATE as TRITON
from ..under_test import Implementation, ImplementationFailure
from .core import as_array

NAME = "long-context"
LONGEST = 2**16
INTERPRETED_LONGEST = 2**14  # vet's default in Triton's interpreter and for the delta rule
SMALLEST_LONGEST = 2**12  # vet's smallest plan (every check once per dtype)
DIMS = (16, 64)  # the long panel's d, the wide panel's d
WIDE_LONGEST = 2**12  # the wide panel (B = H = 2, d = 64) up to here
MAX_FEATURES = 1024  # head dimensions whose feature vector is longer are left out (taylor)
FALSE_FAILURE = 1e-8  # per case, for the probabilistic bound (docs/accuracy.md; 1e-6 a run)
# Growth: errors growing like n u and like sqrt(n) u differ by 0.5 in log-log slope; 0.3
# flags the first and leaves 0.2 for the noise of a slope fitted on five lengths over a
# 64-fold range (a factor 2.3 in one error). Only where the error at the longest N is also
# GROWTH_MARGIN times the golden's: one lucky golden rounding must not flag a kernel.
GROWTH_EXCESS = 0.3
GROWTH_MARGIN = 2.0
SHARED_DIRECTION = 0.6  # keys: 0.6 r + 0.8 z_j, one direction r shared by every key
# The values of an unnormalised spec (Family.sums_memory) times this: its output sums the
# whole memory, some 0.6 N |q.r| at the longest, past float16's 65504 at 2^16 unscaled
UNNORMALISED_VALUES = 2.0**-5
# A decayed spec's effective memories 1 / rate (Family.long_arguments), one per head: its
# long panel has two heads: thousands of tokens, and more than the whole sequence
MEMORIES = (2**12, 2**20)
# What one call of the kernel may be predicted to count before a length is not run: 2 GiB
# of live intermediates (beside the check's own arrays and the process, vet stays within
# 4 GiB), 2^35 matmul FLOPs (seconds on one core) and a per-token loop of 8 dispatched ops
# at N = 2^16 + 1 (each op costs microseconds whatever its size).
LIMITS = {"peak_bytes": 2 * 2**30, "flops": 2**35, "ops": 8 * (LONGEST + 1)}
# Lengths whose reference, golden and bounds are kept (_standard), up to LONGEST + 1 only:
# a few hundred MiB of them at the default lengths; at --long 2^20 each is 0.5 GiB, never kept
STANDARDS_KEPT = 48
# Panels whose inputs, reference and golden output are kept (_drawn, _reference_and_golden):
# those of one run at the default lengths (3 dtypes x 2 shapes), for the next kernel of the
# spec; a panel longer than LONGEST + 1 is dropped when it is done
PANELS_KEPT = 6
MEMORY_ARRAYS = 32  # (N, d) float64 arrays the check holds at its peak (memory_estimate; README)


def default_longest(interpreted: bool, smallest: bool = False, stepwise: bool = False) -> int:
    """The longest N when none is given: SMALLEST_LONGEST for vet's smallest plan,
    INTERPRETED_LONGEST in Triton's interpreter (seconds a call) or for a stepwise family
    (Family.stepwise: the delta rule's a-priori bound and golden are recurrences token by
    token: README), else LONGEST."""
    if smallest:
        return SMALLEST_LONGEST
    return INTERPRETED_LONGEST if interpreted or stepwise else LONGEST


def lengths(longest: int = LONGEST) -> tuple[int, ...]:
    """2^10, 2^12, ... below `longest`, then `longest` + 1: exact at a power of two and wrong
    one past it is a known failure (fla #906), and the powers of two below show the first."""
    steps = [2**e for e in range(10, 64, 2) if 2**e < longest]
    return (*steps, longest + 1)


def memory_estimate(longest: int, d: int = DIMS[0]) -> int:
    """Bytes the check needs at `longest`: float64 copies of the inputs, the reference's
    values, bound and scale, the golden's and the kernel's outputs and their temporaries,
    about MEMORY_ARRAYS arrays of (N, d) doubles per head of the long panel (a decayed
    spec's has len(MEMORIES); README, "Long context")."""
    return MEMORY_ARRAYS * 8 * (longest + 1) * d * len(MEMORIES)


def available_memory() -> int | None:
    """Bytes of memory available now (Linux's MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memory_problem(longest: int) -> str | None:
    """Why `longest` cannot be checked on this machine, with the estimate, or None."""
    need, have = memory_estimate(longest), available_memory()
    if have is None or need <= have:
        return None
    return (
        f"--long {longest} needs about {need / 2**30:.3g} GiB (the check's estimate), "
        f"and {have / 2**30:.3g} GiB are available: give a smaller N"
    )


@dataclass
class Panel:
    """One dtype and shape: per length, the verdict and the golden's largest error."""

    dtype: str
    b: int
    h: int
    d: int
    errors: dict[int, float] = field(default_factory=dict)
    golden: dict[int, float] = field(default_factory=dict)
    floors: dict[int, float] = field(default_factory=dict)
    problem: tuple[int, str, str] | None = None  # (N, severity, what) of the first failure
    contract: bool = False  # that failure is the implementation breaking the contract
    stop: Stop | None = None  # the first length not run, and why
    # where the failure's call ran tl.dots with TF32 products: whether the same length
    # passes with IEEE ones (the evidence of vet's tf32-products cause, checks/core.py)
    ieee_passes: bool | None = None

    @property
    def label(self) -> str:
        return f"{self.dtype} B={self.b} H={self.h} d={self.d}"


def inputs(spec: Spec, n: int, b: int, h: int, d: int, dtype: str, seed: int, device: str):
    """q, k, v, W (m = d) and the family's argument (Family.long_arguments: a decay of head
    h's rate 1 / MEMORIES[h mod 2]) of the typical regime, (B, H, n, d),
    in `dtype` on `device` as cases.Case.tensors gives them (module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, d, generator=gen, dtype=torch.float64)
    r = torch.randn(b, h, 1, d, generator=gen, dtype=torch.float64)
    z = torch.randn(b, h, n, d, generator=gen, dtype=torch.float64)
    k = SHARED_DIRECTION * r + math.sqrt(1 - SHARED_DIRECTION**2) * z
    v = 1.0 + torch.randn(b, h, n, d, generator=gen, dtype=torch.float64)
    family = family_of(spec)
    if not spec.normalize and family.sums_memory:  # exact in any dtype
        v = v * UNNORMALISED_VALUES
    rates = 1.0 / torch.tensor(MEMORIES, dtype=torch.float64).repeat(h)[:h]
    as_dtype = getattr(torch, dtype)
    k, decay = family.long_arguments(spec, k, rates, seed, as_dtype)
    w = None
    if spec.info.needs_projection:
        w = sample_projection_torch(d, d, "orthogonal", gen, dtype=torch.float64)
    return tuple(
        None if t is None else t.to(device=device, dtype=as_dtype) for t in (q, k, v, w, decay)
    )


def long_context(
    impl: Implementation,
    dtypes: tuple[str, ...],
    device: str = "cpu",
    longest: int = LONGEST,
    seed: int = 0,
    say: Callable[[str], None] = lambda text: None,
    dims: tuple[int, ...] = DIMS,
) -> CheckResult:
    """The check (module docstring) over `dtypes`: per dtype the long panel (B = H = 1, d =
    dims[0]) and the wide one (B = H = 2, d = dims[-1], to WIDE_LONGEST), each d the
    nearest the implementation takes (HeadDims.d); a d whose feature vector is longer than
    MAX_FEATURES is left out."""
    spec = impl.spec
    ns = lengths(longest)
    judged = [t for t in dtypes if t != "float64"]
    dims = [impl.head_dims.d(d) for d in dims]
    dims = [d for d in dims if spec.info.feature_dim(d, d) <= MAX_FEATURES]
    wide = tuple(n for n in ns if n <= WIDE_LONGEST)
    heads = len(MEMORIES) if family_of(spec).forgets(spec) else 1  # one head per memory
    shapes = [(1, heads, dims[0], ns), (2, 2, dims[-1], wide)]
    panels = [(Panel(t, b, h, d), upto) for t in judged for b, h, d, upto in shapes]
    costly = None  # the first stop for a cost growing faster than claimed: it holds for all
    for i, (panel, upto) in enumerate(panels):
        runs = tuple(n for n in upto if costly is None or n < costly.n)
        say(f"{NAME}: {panel.label} ({i + 1}/{len(panels)}), N up to {runs[-1]}")
        _run_panel(impl, panel, runs, device, seed + i)
        if runs[-1] > LONGEST + 1:
            _drawn.cache_clear()
            _reference_and_golden.cache_clear()
            _prefix_bound.cache_clear()
        if runs != upto and panel.stop is None:
            panel.stop = costly
        if costly is None and panel.stop and panel.stop.superlinear:
            costly = panel.stop
    return _result(spec, [p for p, _ in panels], ns, judged, dtypes)


def not_applicable(impl: Implementation, dtypes: tuple[str, ...]) -> str | None:
    """Why the check does not apply to `impl` in `dtypes`, or None."""
    if lacking := family_of(impl.spec).lacks.get(NAME):
        return lacking
    if impl.cost == "quadratic":
        return "the implementation declares quadratic cost: long N is not what it is for"
    if all(t == "float64" for t in dtypes):
        return "float64 only: it is judged against correctly rounded references at N <= 1024"
    return None


def _run_panel(impl, panel: Panel, ns, device: str, seed: int) -> None:
    """Judge every length of the panel in turn; stop at the first failure (the smallest N
    shows it) or before a length whose predicted cost is past LIMITS (panel.stop)."""
    spec, u = impl.spec, unit_roundoff(panel.dtype, impl.spec)
    draw = Draw(spec, panel.dtype, panel.b, panel.h, panel.d, ns[-1], seed, device)
    prefix_stable = spec.causal and spec.feature_map != "cosformer"
    runs: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # N: (output, element budgets)
    costs: list[Cost] = []
    for n in ns:
        panel.stop = predicted_stop(costs, n)
        if panel.stop:
            return
        qn, kn, vn, w, decay = draw.tensors(n)
        call = functools.partial(impl, qn, kn, vn, w, decay)
        dots = TRITON.tf32_dots
        try:
            if len(costs) < 2 < len(ns):  # the two shortest lengths' counts predict the rest
                result, cost = counted(call, n)
                costs.append(cost)
            else:  # counting costs ten times the call for a kernel looping over tokens
                result = call()
        except ImplementationFailure as err:
            panel.problem, panel.contract = (n, "wrong", f"the implementation {err}"), True
            return
        out = as_array(result)
        x = validate(qn, kn, vn, spec, w, decay)
        ref, golden, bounds, resolvable = standard(draw, n)
        verdict = judge(result, x, spec, ref, golden, bounds, resolvable)
        # where the budget and the growth look; an exact value beyond the dtype's range
        # rounded to inf is right (an unnormalised output at long N in float16)
        judged = resolvable & ~np.isnan(ref) & ~rounded_to_inf(out, ref, panel.dtype)
        e = error_units(out, ref, bounds[panel.dtype][0], u)
        panel.errors[n] = float(np.max(e, where=judged, initial=0.0))
        panel.golden[n] = verdict.golden_max_error
        panel.floors[n] = attainable_floor(spec, x, u)
        if prefix_stable:  # each element's budget where a budget or a finite bound judges
            scale, bound = bounds[panel.dtype]
            budgets = element_budgets(x, spec, ref, scale, u, verdict.budget)
            runs[n] = (out, np.where(resolvable | np.isfinite(bound), budgets, np.inf))
        if not verdict.passed:
            bad = (~np.isfinite(out) & ~beyond_range(ref, panel.dtype) & ~np.isnan(ref)).any()
            what = "non-finite" if bad else "bound" if not verdict.within_bound else "budget"
            panel.problem = (n, verdict.severity, f"{what}: {verdict.message}")
            if impl.tf32 and TRITON.tf32_dots > dots:
                panel.ieee_passes = _ieee_passes(impl, (qn, kn, vn, w, decay), x, draw, n)
            return
        if prefix_stable and n != ns[0]:
            problem = _prefix_problem(runs, n, u, bounds[panel.dtype][0], ref, panel.dtype)
            if problem:
                panel.problem = (n, "wrong", problem)
                return
    panel.problem = _growth_problem(panel)


def _ieee_passes(impl: Implementation, arguments, x, draw: Draw, n: int) -> bool:
    """Whether the length a call with TF32 tl.dots failed at passes with IEEE products
    (checks/core.py's experiment, once, at that length)."""
    ref, golden, bounds, resolvable = standard(draw, n)
    try:
        out = replace(impl, tf32=False)(*arguments)
    except ImplementationFailure:
        return False
    return judge(out, x, impl.spec, ref, golden, bounds, resolvable).passed


def resolvable_rows(x, spec: Spec, lam: float) -> np.ndarray:
    """The rows whose denominator a float32 evaluation resolves (kappa gamma~_n(float32) <
    1/2, Higham & Mary's gamma with `lam`): elsewhere (performer-trig's denominators cancel
    more as N grows) correct evaluations differ by chance beyond any fixed budget, and
    the bound alone judges (vacuous there in these dtypes) with finiteness."""
    if not spec.normalize:  # no denominator
        return np.ones((*x.shape[:3], 1), dtype=bool)
    n = spec.info.feature_dim(x.shape[4], x.shape[4]) + x.shape[3] + 1
    g = gamma_probabilistic(n, unit_roundoff("float32", spec), lam)
    return denominator_condition(x, spec) * g < 0.5


def probabilistic_terms(x, spec: Spec) -> int:
    """Products whose roundings the probabilistic bound covers: per output element, two
    sums (numerator, denominator) of Nk m terms."""
    b, h, nq, nk, d, dv = x.shape
    m = spec.info.feature_dim(d, None if x.projection is None else x.projection.shape[0])
    return 2 * b * h * nq * dv * nk * m


@dataclass(frozen=True)
class Draw:
    """The inputs of one panel: drawn by `inputs` at the longest N; lengths are prefixes."""

    spec: Spec
    dtype: str
    b: int
    h: int
    d: int
    longest: int
    seed: int
    device: str

    def tensors(self, n: int | None = None):
        """(q, k, v, W, decay) of the first n tokens (all without n)."""
        q, k, v, w, decay = _drawn(self)
        if decay is not None and family_of(self.spec).per_token(self.spec):
            decay = decay[:, :, :n]
        return (*(t[:, :, :n] for t in (q, k, v)), w, decay)


@functools.lru_cache(maxsize=PANELS_KEPT)
def _drawn(draw: Draw):
    """The draw's inputs at its longest N, drawn once for its lengths and standards."""
    return inputs(
        draw.spec, draw.longest, draw.b, draw.h, draw.d, draw.dtype, draw.seed, draw.device
    )


def standard(draw: Draw, n: int):
    """_standard under the feature model in force, kept (STANDARDS_KEPT) up to LONGEST + 1."""
    kept = _standard if n <= LONGEST + 1 else _standard.__wrapped__
    return kept(draw, n, FEATURE_MODEL.get())


@functools.lru_cache(maxsize=STANDARDS_KEPT)
def _standard(draw: Draw, n: int, model: str):
    """What a length of a draw is judged against, the same for every implementation of the
    spec (kept for the next one: the zoo and the property suite judge many on one draw):
    the certified reference (settled where it is judged: _judged_rows), the golden linear
    form's output, {dtype: (scale, bound)} (deterministic and probabilistic, feature model
    `model`), and the rows the budget compares."""
    spec, u = draw.spec, unit_roundoff(draw.dtype, draw.spec)
    q, k, v, w, decay = draw.tensors(n)
    x = validate(q, k, v, spec, w, decay)
    if spec.causal and spec.feature_map != "cosformer":  # row i depends on tokens <= i alone
        whole, golden = _reference_and_golden(draw)
        # views: the rows settled here are settled in the kept reference too
        ref = Certified(*(t[:, :, :n] for t in (whole.values, whole.bound, whole.scale)))
        golden = golden[:, :, :n]
    else:
        ref = certified(x, spec)
        golden = golden_attention(q, k, v, spec, w, long_form(spec), decay)
    lam = probabilistic_lambda(probabilistic_terms(x, spec), FALSE_FAILURE, u)
    resolvable = resolvable_rows(x, spec, lam)
    tiny = SMALLEST_SUBNORMAL[draw.dtype]
    if family_of(spec).stepwise:  # its bound's first n rows are n tokens' (Family.stepwise)
        bounds = {draw.dtype: tuple(t[:, :, :n] for t in _prefix_bound(draw))}
        return ref.values, golden, bounds, resolvable
    with feature_model(model):
        bounds = {draw.dtype: scale_and_bound(x, spec, ref.values, u, tiny, lam=lam)}
        judged = _judged_rows(ref, resolvable, bounds[draw.dtype][1], draw.dtype)
        if settle_rows(
            x, spec, ref, judged, family_of(spec).similarity
        ):  # the bound's |out| is the settled value
            bounds = {draw.dtype: scale_and_bound(x, spec, ref.values, u, tiny, lam=lam)}
    return ref.values, golden, bounds, resolvable


def _judged_rows(ref: Certified, resolvable, bound: np.ndarray, dtype: str) -> np.ndarray:
    """The rows (B, H, N) whose reference must be within CERTIFIED_SHARE s: those the budget
    compares (`resolvable`), those whose bound in the dtype is finite, and those whose exact
    values may lie on either side of the dtype's range. The others are judged only for
    finiteness (the bound is infinite where the denominator's error bound reaches it, with
    any reference), which the float64 value within its finite bound decides."""
    low, high = np.abs(ref.values) - ref.bound, np.abs(ref.values) + ref.bound
    straddles = beyond_range(high, dtype) & ~beyond_range(low, dtype)
    return resolvable[..., 0] | (np.isfinite(bound) | straddles).any(axis=-1)


@functools.lru_cache(maxsize=PANELS_KEPT)
def _prefix_bound(draw: Draw) -> tuple[np.ndarray, np.ndarray]:
    """A stepwise family's scale and bound (Family.stepwise; the delta rule's,
    families/delta/bound.py) at the draw's longest N, whose first n rows bound every prefix
    of n tokens: both are recurrences from the first token, and the condition number's
    windows that reach past n tokens hold those cut at n (their condition is at least as
    large), so computed once (a loop over the tokens)."""
    q, k, v, w, decay = draw.tensors()
    x = validate(q, k, v, draw.spec, w, decay)
    ref = _reference_and_golden(draw)[0].values
    u, tiny = unit_roundoff(draw.dtype, draw.spec), SMALLEST_SUBNORMAL[draw.dtype]
    return scale_and_bound(x, draw.spec, ref, u, tiny)


@functools.lru_cache(maxsize=PANELS_KEPT)
def _reference_and_golden(draw: Draw) -> tuple[Certified, torch.Tensor]:
    """The certified reference (unsettled: _standard settles it length by length) and the
    golden linear form's output at the longest N."""
    q, k, v, w, decay = draw.tensors()
    ref = certified(validate(q, k, v, draw.spec, w, decay), draw.spec)
    return ref, golden_attention(q, k, v, draw.spec, w, long_form(draw.spec), decay)


def certified(x, spec: Spec) -> Certified:
    """The certified reference, settled only where its bound is infinite (_standard settles
    the rows it judges), where the family's engine takes rows to settle (the delta rule's
    settles every row: its rows are all resolvable, no denominator)."""
    return families.certified(x, spec, settle=np.zeros(x.shape[:3], dtype=bool))


@dataclass(frozen=True)
class Stop:
    """A length not run: its predicted cost passed LIMITS; superlinear when the counts grow
    faster than the claimed linear cost (a cost finding)."""

    n: int
    what: str
    superlinear: bool


def _size(count: str, value: float) -> str:
    return f"{value / 2**30:.3g} GiB" if count == "peak_bytes" else f"{value:.3g}"


COUNT_NAMES = {"peak_bytes": "peak memory", "flops": "FLOPs", "ops": "dispatched ops"}


def predicted_stop(costs: list[Cost], n: int) -> Stop | None:
    """Whether length n is not run: each count of a call predicted at n from the last two
    lengths counted (log-log growth, at least linear) against LIMITS."""
    if len(costs) < 2:
        return None
    a, b = costs[-2:]
    for count, limit in LIMITS.items():
        x1, x2 = max(getattr(a, count), 1), max(getattr(b, count), 1)
        slope = math.log(x2 / x1) / math.log(b.n / a.n)
        predicted = x2 * (n / b.n) ** max(slope, 1.0)
        if predicted > limit:
            superlinear = count != "ops" and slope > 1 + SLOPE_TOLERANCE
            grows = f"{COUNT_NAMES[count]} grows as N^{slope:.2f} (N = {a.n} to {b.n})"
            what = (
                f"{grows}: N = {n} would count {_size(count, predicted)}, past the check's "
                f"limit of {_size(count, limit)}"
            )
            return Stop(n, f"claims linear cost; {what}" if superlinear else what, superlinear)
    return None


def _prefix_problem(runs, n: int, u: float, scale, ref, dtype: str) -> str | None:
    """The first rows of the run at n against each shorter run, within the sum of their
    element budgets (accuracy/verdict.element_budgets; inf where the bound is vacuous, which
    judges finiteness alone), where neither is beyond the dtype's range (an exact value past
    it rounds to inf or to the largest finite value: both are right)."""
    out, budgets = runs[n]
    for short, (out_short, budgets_short) in runs.items():
        if short >= n:
            continue
        head, exact = out[:, :, :short], ref[:, :, :short]
        e = error_units(head, out_short, scale[:, :, :short], u)
        allowed = budgets[:, :, :short] + budgets_short
        compared = ~beyond_range(exact, dtype) & ~np.isnan(exact) & np.isfinite(allowed)
        excess = np.where(compared, e / allowed, 0.0)
        if excess.max(initial=0.0) > 1:
            at = np.unravel_index(int(np.argmax(excess)), excess.shape)
            return (
                f"prefix: the first {short} rows of the run of length {n} differ from the "
                f"run of length {short} by {e[at]:.3g} u s at {tuple(map(int, at))}, more "
                f"than the two budgets {allowed[at]:.3g}: rows change when the sequence grows"
            )
    return None


def _slope(values: dict[int, float]) -> float:
    """Least-squares slope of log error against log N (errors floored at half a unit)."""
    ns = np.log2(list(values))
    es = np.log2(np.maximum(list(values.values()), 0.5))
    return float(np.polyfit(ns, es, 1)[0]) if len(ns) >= 2 else 0.0


def _growth_problem(panel: Panel) -> tuple[int, str, str] | None:
    if len(panel.errors) < 3:
        return None
    top = max(panel.errors)
    careful = max(panel.golden[top], panel.floors[top])
    mine, theirs = _slope(panel.errors), _slope(panel.golden)
    if mine - theirs <= GROWTH_EXCESS or panel.errors[top] <= GROWTH_MARGIN * careful:
        return None
    return (
        top,
        "inaccurate",
        f"growth: the error grows as N^{mine:.2g} where the golden's grows as N^{theirs:.2g} "
        f"({panel.errors[top]:.3g} u s at N = {top}, golden {panel.golden[top]:.3g}): "
        "it will leave the budget at longer N",
    )


def _result(spec, panels, ns, judged, dtypes) -> CheckResult:
    failed = [p for p in panels if p.problem]
    figures = {f"max_error {p.label} N={n}": e for p in panels for n, e in p.errors.items()}
    skipped = "" if len(judged) == len(dtypes) else "; float64 not judged here (module docstring)"
    if failed:
        first = min(failed, key=lambda p: (p.problem[0], p.problem[1] != "wrong"))
        n, severity, what = first.problem
        also = f" ({len(failed)} of {len(panels)} panels fail)" if len(failed) > 1 else ""
        detail = f"{spec} {first.label}: fails from N = {n}: {what}{also}"
        u = unit_roundoff(first.dtype, spec)
        figures["relative_error"] = first.errors.get(n, math.inf) * u
        figures["first_failing_n"] = n
        if all(p.ieee_passes for p in failed):  # every failure is TF32 products' (core.py)
            figures["ieee_products_pass"] = True
        contract = "contract" if all(p.contract for p in failed) else None  # vet's: under it
        if contract:  # the d of the calls that raised (vet's probe_head_dims)
            figures["d"] = min(p.d for p in failed)
        return CheckResult(
            NAME, False, detail, figures=figures, severity=severity, regime="typical",
            cause=contract,
        )  # fmt: skip
    stops = [p for p in panels if p.stop]
    costly = next((p for p in stops if p.stop.superlinear), None)
    if costly:
        detail = f"{costly.label}: stopped before N = {costly.stop.n}: {costly.stop.what}"
        return CheckResult(
            NAME, False, detail, figures=figures, severity="wrong", regime="typical", cause="cost"
        )
    worst = max(panels, key=lambda p: max(p.errors.values(), default=0.0))
    top = max(worst.errors, default=ns[-1])
    shorter = "".join(f"; {p.label} not run from N = {p.stop.n} ({p.stop.what})" for p in stops)
    detail = (
        f"N = {', '.join(map(str, ns))} in {', '.join(judged)} (B = H = 2, d = {panels[-1].d} "
        f"to N = {max(panels[-1].errors, default=0)}): within bound and budget, no growth "
        f"beyond the golden's; largest error {worst.errors.get(top, 0.0):.3g} u s "
        f"({worst.label}, N = {top}, golden {worst.golden.get(top, 0.0):.3g}){shorter}{skipped}"
    )
    return CheckResult(NAME, True, detail, figures=figures)
