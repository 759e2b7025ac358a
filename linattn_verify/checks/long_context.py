"""The long-context check: the implementation at the lengths linear attention is for.

Per dtype and head dimension, one input of the typical regime at the longest length (q, k
~ N(0, 1) with the keys sharing a direction, values ~ N(1, 1): a mean, so that errors
proportional to the output show), and its prefixes of LENGTHS tokens. At each length:

- finiteness: a non-finite output where the exact one is finite is wrong;
- accuracy against the certified reference (reference/certified.py): the a-priori bound at
  that N, the smaller of Higham's deterministic gamma_n and Higham & Mary's probabilistic
  one (accuracy/bound.py; the deterministic one is vacuous past n u >= 1, e.g. float16
  past N = 2048), with a false-failure probability of FALSE_FAILURE per case; and the
  budget, K_BUDGET times the golden implementation's error at the same N;
- for causal specs whose weights do not depend on N (all but cosFormer), prefix
  consistency: the first n rows of the longest run against the run of length n, within
  the two budgets (implied by the accuracy of both; it names the failure better);
and over the lengths, growth: an error that grows faster with N than the golden's by
GROWTH_EXCESS in the log-log slope, and exceeds GROWTH_MARGIN times the golden's at the
longest N, is flagged (an error growing like n u where the golden's grows like sqrt(n) u).
A failure names the smallest N where it shows. float64 is judged against correctly rounded
references elsewhere (the certified one is within 2^-34 s, not 2^-53): not here.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ..accuracy.bound import (
    FEATURE_MODEL,
    denominator_condition,
    feature_model,
    gamma_probabilistic,
    probabilistic_lambda,
    scale_and_bound,
)
from ..accuracy.verdict import AccuracyVerdict, attainable_floor, error_units, judge
from ..implementations.golden import golden_attention
from ..implementations.projection import sample_projection_torch
from ..inputs import SMALLEST_SUBNORMAL, UNIT_ROUNDOFF, validate
from ..reference.certified import certified_attention
from ..results import CheckResult
from ..specs import Spec
from ..under_test import Implementation, ImplementationFailure
from .core import as_array

NAME = "long-context"
LONGEST = 2**16
DIMS = (16, 64)
MAX_FEATURES = 1024  # head dimensions whose feature vector is longer are left out (taylor)
FALSE_FAILURE = 1e-8  # per case, for the probabilistic bound (docs/accuracy.md; 1e-6 a run)
# Growth: errors growing like n u and like sqrt(n) u differ by 0.5 in log-log slope; 0.3
# flags the first and leaves 0.2 for the noise of a slope fitted on five lengths over a
# 64-fold range (a factor 2.3 in one error). Only where the error at the longest N is also
# GROWTH_MARGIN times the golden's: one lucky golden rounding must not flag a kernel.
GROWTH_EXCESS = 0.3
GROWTH_MARGIN = 2.0
SHARED_DIRECTION = 0.6  # keys: 0.6 r + 0.8 z_j, one direction r shared by every key
TIME_LIMIT = 120.0  # seconds of kernel time a length may be predicted to take
# Lengths whose reference, golden and bounds are kept (_standard), up to LONGEST + 1 only:
# about 1 GiB of them at the default lengths; at --long 2^20 each is 2 GiB, never kept
STANDARDS_KEPT = 48
MEMORY_ARRAYS = 32  # (N, d) float64 arrays the check holds at its peak (memory_estimate; README)


def lengths(longest: int = LONGEST) -> tuple[int, ...]:
    """2^10, 2^12, ... below `longest`, `longest` itself and `longest` + 1: exact at a
    power of two and wrong one past it is a known failure (fla #906)."""
    steps = [2**e for e in range(10, 64, 2) if 2**e < longest]
    return (*steps, longest, longest + 1)


def memory_estimate(longest: int, d: int = max(DIMS)) -> int:
    """Bytes the check needs at `longest`: float64 copies of the inputs, the reference's
    values, bound and scale, the golden's and the kernel's outputs and their temporaries,
    about MEMORY_ARRAYS arrays of (N, d) doubles (README, "Long context")."""
    return MEMORY_ARRAYS * 8 * (longest + 1) * d


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

    @property
    def label(self) -> str:
        return f"{self.dtype} B={self.b} H={self.h} d={self.d}"


def inputs(spec: Spec, n: int, b: int, h: int, d: int, dtype: str, seed: int, device: str):
    """q, k, v (and W, m = d) of the typical regime, (B, H, n, d), all four in `dtype` on
    `device` as cases.Case.tensors gives them (module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, d, generator=gen, dtype=torch.float64)
    r = torch.randn(b, h, 1, d, generator=gen, dtype=torch.float64)
    z = torch.randn(b, h, n, d, generator=gen, dtype=torch.float64)
    k = SHARED_DIRECTION * r + math.sqrt(1 - SHARED_DIRECTION**2) * z
    v = 1.0 + torch.randn(b, h, n, d, generator=gen, dtype=torch.float64)
    w = None
    if spec.info.needs_projection:
        w = sample_projection_torch(d, d, "orthogonal", gen, dtype=torch.float64)
    as_dtype = getattr(torch, dtype)
    return tuple(None if t is None else t.to(device=device, dtype=as_dtype) for t in (q, k, v, w))


def long_context(
    impl: Implementation,
    dtypes: tuple[str, ...],
    device: str = "cpu",
    longest: int = LONGEST,
    seed: int = 0,
    say: Callable[[str], None] = lambda text: None,
    dims: tuple[int, ...] = DIMS,
) -> CheckResult:
    """The check (module docstring) over `dtypes` and head dimensions `dims`, plus one panel
    with B = H = 2."""
    spec = impl.spec
    ns = lengths(longest)
    judged = [t for t in dtypes if t != "float64"]
    dims = [d for d in dims if spec.info.feature_dim(d, d) <= MAX_FEATURES]
    shapes = [(1, 1, d) for d in dims] + [(2, 2, dims[0])]
    panels = [Panel(t, b, h, d) for t in judged for b, h, d in shapes]
    stopped = None
    for i, panel in enumerate(panels):
        upto = ns if panel.b * panel.h == 1 else tuple(n for n in ns if n <= 2**12)
        say(f"{NAME}: {panel.label} ({i + 1}/{len(panels)}), N up to {upto[-1]}")
        stopped = _run_panel(impl, panel, upto, device, seed + i) or stopped
    return _result(spec, panels, ns, stopped, judged, dtypes)


def not_applicable(impl: Implementation, dtypes: tuple[str, ...]) -> str | None:
    """Why the check does not apply to `impl` in `dtypes`, or None."""
    if impl.cost == "quadratic":
        return "the implementation declares quadratic cost: long N is not what it is for"
    if not impl.spec.plain:
        return f"its certified reference is for plain specs, not {impl.spec}"
    if all(t == "float64" for t in dtypes):
        return "float64 only: it is judged against correctly rounded references at N <= 1024"
    return None


def _run_panel(impl, panel: Panel, ns, device: str, seed: int) -> str | None:
    """Judge every length of the panel in turn; stop at the first failure (the smallest N
    shows it) or when the next length is predicted to take over TIME_LIMIT."""
    spec, u = impl.spec, UNIT_ROUNDOFF[panel.dtype]
    draw = Draw(spec, panel.dtype, panel.b, panel.h, panel.d, ns[-1], seed, device)
    q, k, v, w = draw.tensors()
    prefix_stable = spec.causal and spec.feature_map != "cosformer"
    runs: dict[int, tuple[np.ndarray, AccuracyVerdict]] = {}
    times: list[tuple[int, float]] = []
    for n in ns:
        late = _predicted_too_slow(times, n)
        if late:
            return late
        qn, kn, vn = (t[:, :, :n] for t in (q, k, v))
        start = time.perf_counter()
        try:
            result = impl(qn, kn, vn, w)
        except ImplementationFailure as err:
            panel.problem = (n, "wrong", f"the implementation {err}")
            return None
        times.append((n, time.perf_counter() - start))
        out = as_array(result)
        x = validate(qn, kn, vn, spec, w)
        ref, golden, bounds, resolvable = standard(draw, n)
        verdict = judge(result, x, spec, ref, golden, bounds, resolvable)
        judged = resolvable & ~np.isnan(ref)  # where the budget and the growth look
        e = error_units(out, ref, bounds[panel.dtype][0], u)
        panel.errors[n] = float(np.max(e, where=judged, initial=0.0))
        panel.golden[n] = verdict.golden_max_error
        panel.floors[n] = attainable_floor(spec, x, u)
        runs[n] = (out, verdict)
        if not verdict.passed:
            bad = (~np.isfinite(out) & np.isfinite(ref)).any()
            what = "non-finite" if bad else "bound" if not verdict.within_bound else "budget"
            panel.problem = (n, verdict.severity, f"{what}: {verdict.message}")
            return None
        if prefix_stable and n != ns[0]:
            problem = _prefix_problem(runs, n, x, spec, u, bounds[panel.dtype][0])
            if problem:
                panel.problem = (n, "wrong", problem)
                return None
    panel.problem = _growth_problem(panel)
    return None


def resolvable_rows(x, spec: Spec, lam: float) -> np.ndarray:
    """The rows whose denominator a float32 evaluation resolves (kappa gamma~_n(float32) <
    1/2, Higham & Mary's gamma with `lam`): elsewhere (performer-trig's denominators cancel
    more as N grows) correct evaluations differ by chance beyond any fixed budget, and
    the bound alone judges (vacuous there in these dtypes) with finiteness."""
    n = spec.info.feature_dim(x.shape[4], x.shape[4]) + x.shape[3] + 1
    g = gamma_probabilistic(n, UNIT_ROUNDOFF["float32"], lam)
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
        q, k, v, w = inputs(
            self.spec, self.longest, self.b, self.h, self.d, self.dtype, self.seed, self.device
        )
        return (*(t[:, :, :n] for t in (q, k, v)), w)


def standard(draw: Draw, n: int):
    """_standard under the feature model in force, kept (STANDARDS_KEPT) up to LONGEST + 1."""
    kept = _standard if n <= LONGEST + 1 else _standard.__wrapped__
    return kept(draw, n, FEATURE_MODEL.get())


@functools.lru_cache(maxsize=STANDARDS_KEPT)
def _standard(draw: Draw, n: int, model: str):
    """What a length of a draw is judged against, the same for every implementation of the
    spec (kept for the next one: the zoo and the property suite judge many on one draw):
    the certified reference, the golden linear form's output,
    {dtype: (scale, bound)} (deterministic and probabilistic, feature model `model`), and
    the rows the budget compares."""
    spec, u = draw.spec, UNIT_ROUNDOFF[draw.dtype]
    q, k, v, w = draw.tensors(n)
    x = validate(q, k, v, spec, w)
    if spec.causal and spec.feature_map != "cosformer":  # row i depends on tokens <= i alone
        ref, golden = _reference_and_golden(draw)
        ref, golden = ref[:, :, :n], golden[:, :, :n]
    else:
        ref = certified_attention(x, spec).values
        golden = golden_attention(q, k, v, spec, w, "linear")
    lam = probabilistic_lambda(probabilistic_terms(x, spec), FALSE_FAILURE, u)
    tiny = SMALLEST_SUBNORMAL[draw.dtype]
    with feature_model(model):
        bounds = {draw.dtype: scale_and_bound(x, spec, ref, u, tiny, lam=lam)}
    return ref, golden, bounds, resolvable_rows(x, spec, lam)


@functools.lru_cache(maxsize=2)
def _reference_and_golden(draw: Draw) -> tuple[np.ndarray, torch.Tensor]:
    """The certified reference and the golden linear form's output at the longest N."""
    q, k, v, w = draw.tensors()
    ref = certified_attention(validate(q, k, v, draw.spec, w), draw.spec).values
    return ref, golden_attention(q, k, v, draw.spec, w, "linear")


def _predicted_too_slow(times: list[tuple[int, float]], n: int) -> str | None:
    """A reason to stop before length n, if the kernel's time so far predicts it takes
    over TIME_LIMIT (the growth fitted from the last two lengths)."""
    if len(times) < 2:
        return None
    (n1, t1), (n2, t2) = times[-2:]
    slope = math.log(max(t2, 1e-4) / max(t1, 1e-4)) / math.log(n2 / n1)
    predicted = t2 * (n / n2) ** max(slope, 1.0)
    if predicted <= TIME_LIMIT:
        return None
    return (
        f"stopped before N = {n}: the kernel's time grows as N^{slope:.2g} "
        f"({t2:.3g} s at N = {n2}), so N = {n} would take about {predicted:.3g} s"
    )


def _prefix_problem(runs, n: int, x, spec: Spec, u: float, scale) -> str | None:
    """The first rows of the run at n against each shorter run, within both budgets."""
    out, verdict = runs[n]
    for short, (out_short, verdict_short) in runs.items():
        if short >= n:
            continue
        e = error_units(out[:, :, :short], out_short, scale[:, :, :short], u)
        allowed = verdict.budget + verdict_short.budget
        if e.max() > allowed:
            return (
                f"prefix: the first {short} rows of the run of length {n} differ from the "
                f"run of length {short} by {e.max():.3g} u s, more than the two budgets "
                f"{allowed:.3g}: rows change when the sequence grows"
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


def _result(spec, panels, ns, stopped, judged, dtypes) -> CheckResult:
    failed = [p for p in panels if p.problem]
    figures = {f"max_error {p.label} N={n}": e for p in panels for n, e in p.errors.items()}
    skipped = "" if len(judged) == len(dtypes) else "; float64 not judged here (module docstring)"
    if failed:
        first = min(failed, key=lambda p: (p.problem[0], p.problem[1] != "wrong"))
        n, severity, what = first.problem
        also = f" ({len(failed)} of {len(panels)} panels fail)" if len(failed) > 1 else ""
        detail = f"{spec} {first.label}: fails from N = {n}: {what}{also}"
        figures["relative_error"] = first.errors.get(n, math.inf) * UNIT_ROUNDOFF[first.dtype]
        return CheckResult(
            NAME, False, detail, figures=figures, severity=severity, regime="typical"
        )
    if stopped:
        return CheckResult(NAME, False, f"not run in full: {stopped}", figures={"stopped": 1.0})
    worst = max(panels, key=lambda p: max(p.errors.values(), default=0.0))
    top = max(worst.errors, default=ns[-1])
    detail = (
        f"N = {', '.join(map(str, ns))} in {', '.join(judged)}, d in "
        f"{sorted({p.d for p in panels})}: within bound and budget, no growth beyond the "
        f"golden's; largest error {worst.errors.get(top, 0.0):.3g} u s ({worst.label}, N = {top}, "
        f"golden {worst.golden.get(top, 0.0):.3g}){skipped}"
    )
    return CheckResult(NAME, True, detail, figures=figures)
