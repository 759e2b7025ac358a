"""What every check shares: the implementation under test, the result, and the comparison of
two outputs within the a-priori floating-point bound.

Two evaluations of the same exact value by algorithms that each satisfy the bound of
accuracy/bound.py differ by at most the sum of their bounds. So a check that compares two
outputs allows |a - b| <= (bound_a + bound_b) u s element by element, the bound taken with
|out| <= s in place of the exact output (no reference needed): a tolerance derived from the
shapes, the dtype and the inputs, never a hand-picked rtol.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..accuracy.bound import scale_and_bound
from ..cases import Case
from ..inputs import SMALLEST_SUBNORMAL, UNIT_ROUNDOFF, AttentionInputs, validate
from ..specs import Spec, SpecError

LAYOUTS = ("bhnd", "bnhd")
# a stream factory: stream(max_len, projection) -> piece(q, k, v) -> out, carrying state
StreamFactory = Callable[[int, torch.Tensor | None], Callable[..., torch.Tensor]]


class ImplementationFailure(Exception):
    """The implementation raised or returned something that is not an output."""


@dataclass(frozen=True)
class Implementation:
    """Anything under test, behind DESIGN's contract: fn(q, k, v[, projection=W]).

    layout: the layout fn takes and returns, "bhnd" (B, H, N, d) or "bnhd" (B, N, H, d);
    calls go through __call__ with (B, H, N, d) tensors. stream: for causal specs with a
    state API, stream(max_len, W) returns a callable that takes the sequence in pieces.
    command: the arguments that name it to `python -m linattn_verify check`.
    """

    fn: Callable[..., Any]
    spec: Spec
    name: str
    command: str
    layout: str = "bhnd"
    stream: StreamFactory | None = None

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise SpecError(f"layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")

    def to_layout(self, t: torch.Tensor) -> torch.Tensor:
        """A (B, H, N, x) tensor in the implementation's layout (a view)."""
        return t.transpose(1, 2) if self.layout == "bnhd" else t

    def call_raw(self, q, k, v, projection=None) -> torch.Tensor:
        """fn on tensors already in its layout; any exception becomes ImplementationFailure."""
        kwargs = {"projection": projection} if self.spec.info.needs_projection else {}
        try:
            out = self.fn(q, k, v, **kwargs)
        except Exception as err:  # the implementation's failure is a finding, not a crash
            raise ImplementationFailure(f"raised {type(err).__name__}: {err}") from None
        if not isinstance(out, torch.Tensor):
            raise ImplementationFailure(f"returned {type(out).__name__}, not a torch tensor")
        return out

    def __call__(self, q, k, v, projection=None) -> torch.Tensor:
        """The output (B, H, N, dv) for (B, H, N, d) inputs, contiguous in fn's layout."""
        args = (self.to_layout(t).contiguous() for t in (q, k, v))
        out = self.call_raw(*args, projection)
        want = (*q.shape[:3], v.shape[-1])
        if out.dim() != 4 or tuple(self.to_layout(out).shape) != want:
            shape = tuple(out.shape)
            raise ImplementationFailure(f"returned shape {shape}, expected {want} ({self.layout})")
        return self.to_layout(out)


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check on one case: pass/fail, figures, a message naming the input.

    by_nature: set when the spec itself violates the property on this input (relu's zero
    denominator, performer-trig's negative one): an expected failure, with its reason.
    """

    check: str
    passed: bool
    message: str
    case: Case | None = None
    figures: dict[str, float] = field(default_factory=dict)
    by_nature: str | None = None
    repro: str | None = None

    def report(self) -> str:
        """The message, the case and the command that reproduces it."""
        lines = [f"{self.check}: {'pass' if self.passed else 'FAIL'}: {self.message}"]
        if self.by_nature:
            lines.append("  by nature of the spec: an expected failure, not a bug")
        if self.case is not None:
            lines.append(f"  case: {self.case}")
        if self.repro:
            lines.append(f"  reproduce: {self.repro}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.check,
            "status": "pass" if self.passed else "fail",
            "detail": self.message,
            "figures": self.figures,
            "by_nature": self.by_nature,
            "case": None if self.case is None else self.case.to_json(),
            "reproduce": self.repro,
        }


def repro_command(check: str, impl: Implementation, case: Case) -> str:
    """One line that reruns `check` on `case`."""
    case_json = shlex.quote(case.to_json())
    return f"python -m linattn_verify check {check} {impl.command} --case {case_json}"


def case_generator(case: Case, salt: int) -> torch.Generator:
    """A generator for a check's own draws on `case` (permutations, cut points), one per
    salt, fixed by the case's seed."""
    return torch.Generator().manual_seed(case.seed * 7919 + salt)


def as_array(out: torch.Tensor) -> np.ndarray:
    """float64 numpy copy of an output, NaN and inf kept."""
    return out.detach().to(device="cpu", dtype=torch.float64).numpy()


def inputs_of(case: Case, spec: Spec) -> tuple[tuple, AttentionInputs]:
    """((q, k, v, W) tensors, their exact float64 copies)."""
    q, k, v, w = case.tensors()
    return (q, k, v, w), validate(q, k, v, spec, w)


@dataclass(frozen=True)
class Tolerance:
    """Per element (B, H, N, dv): scale s (NaN where the exact value is 0/0) and the a-priori
    bound in units of u s of the dtype of the inputs."""

    scale: np.ndarray
    bound: np.ndarray
    u: float

    @classmethod
    def of(cls, x: AttentionInputs, spec: Spec) -> Tolerance:
        u = UNIT_ROUNDOFF[x.dtype]
        scale, bound = scale_and_bound(x, spec, None, u, SMALLEST_SUBNORMAL[x.dtype])
        return cls(scale, bound, u)

    def allowance(self, times: float = 2.0) -> np.ndarray:
        """times x the bound in absolute terms (0 where s = 0: the exact output is 0)."""
        with np.errstate(invalid="ignore"):
            return np.where(self.scale > 0, times * self.bound * self.u * self.scale, 0.0)

    def units(self, diff: np.ndarray) -> np.ndarray:
        """|diff| in units of u s (0 where diff is 0)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(diff == 0, 0.0, np.abs(diff) / (self.u * self.scale))


@dataclass(frozen=True)
class Mismatch:
    """Where two outputs disagree beyond the allowance, and by how much."""

    count: int
    index: tuple[int, ...]
    units: float  # |a - b| / (u s) at index
    allowed: float  # allowance / (u s) at index

    def describe(self, what: str) -> str:
        return (
            f"{what}: {self.count} element(s) outside the bound; at (b, h, i, c) = {self.index} "
            f"they differ by {self.units:.3g} u s, allowed {self.allowed:.3g} u s"
        )


def mismatch(
    a: np.ndarray, b: np.ndarray, tol: Tolerance, allowance: np.ndarray, rows: Any = ...
) -> Mismatch | None:
    """None if a and b agree within `allowance` wherever the exact value is defined (among
    `rows`, an index into (B, H, N, dv)); else the worst disagreement. Equal values agree
    (the same infinity, and NaN with NaN: whether a value may be non-finite is for the
    positivity and reference checks to judge); a non-finite value against any other is a
    disagreement."""
    defined = np.zeros(a.shape, dtype=bool)
    defined[rows] = True
    defined &= ~np.isnan(tol.scale)
    with np.errstate(invalid="ignore"):
        diff = np.abs(a - b)
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        # an infinite difference is bad even against an infinite (vacuous) allowance
        bad = defined & ~same & ~(np.isfinite(diff) & (diff <= allowance))
    if not bad.any():
        return None
    units = np.where(bad, tol.units(diff), 0.0)
    units = np.where(np.isnan(units), np.inf, units)
    worst = np.unravel_index(int(np.argmax(units)), units.shape)
    allowed = allowance[worst] / (tol.u * tol.scale[worst]) if tol.scale[worst] > 0 else 0.0
    return Mismatch(int(bad.sum()), tuple(int(t) for t in worst), float(units[worst]), allowed)


@dataclass(frozen=True)
class Outcome:
    """What a check body returns; `check` turns it into a CheckResult."""

    passed: bool
    message: str
    figures: dict[str, float] = field(default_factory=dict)
    by_nature: str | None = None


def agreement(what: str, mis: Mismatch | None, detail: str = "") -> Outcome:
    """The outcome of comparing two outputs: pass, or the worst disagreement."""
    if mis is None:
        return Outcome(True, f"{what}{detail}: agree within the bound")
    return Outcome(False, mis.describe(what + detail), {"units": mis.units, "allowed": mis.allowed})


CheckFn = Callable[..., CheckResult]


def check(name: str) -> Callable[[Callable[..., Outcome]], CheckFn]:
    """Make body(impl, case, ...) -> Outcome a check returning a CheckResult; an exception or
    a non-tensor from the implementation fails the check with its message."""

    def wrap(body: Callable[..., Outcome]) -> CheckFn:
        def run(impl: Implementation, case: Case, **options: Any) -> CheckResult:
            try:
                outcome = body(impl, case, **options)
            except ImplementationFailure as err:
                outcome = Outcome(False, f"{impl.name} {err}")
            repro = None if outcome.passed else repro_command(name, impl, case)
            return CheckResult(
                name, outcome.passed, outcome.message, case, outcome.figures,
                outcome.by_nature, repro,
            )  # fmt: skip

        run.__name__ = run.__qualname__ = body.__name__
        run.__doc__ = body.__doc__
        run.check_name = name
        return run

    return wrap
