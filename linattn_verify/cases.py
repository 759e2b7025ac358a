"""Test cases: a handful of numbers (shape, dtype, kind, magnitude, seed) that build q, k, v
and W deterministically, so a failing case is reproduced from its one-line description.

Kinds (the draws of the property suite; regimes.py says which regime each case is in):
- normal: q, k ~ N(0, 1) magnitude, v ~ N(0, 1);
- mean-values: the same with v ~ N(VALUE_MEAN, 1): errors proportional to the output show
  there, where zero-mean values hide them;
- outlier-channels: the same with one coordinate (channel) of q and k OUTLIER_FACTOR times
  larger, as trained models have;
- identical: every token the same (all weights equal);
- dominant: one key set to 4 times the mean query (its weight dominates);
- zero-rows: about a third of the q and k rows are exactly 0;
- cancel: v_j = (-1)^j 1000 + N(0, 1): the output is a small difference of large terms;
- negative-rows: q, k ~ N(0, 1) and about a third of their rows entirely negative,
  -magnitude - |N(0, 1)| (elu's features exp(x) underflow there unless shifted);
- positive-rows: the same with rows entirely positive, magnitude + |N(0, 1)| (sums of
  large features: a normaliser kept in float16 overflows);
- large-norm: q, k ~ N(0, 1) and about a third of their rows scaled to norm magnitude
  (Performer exponents |x'|^2 / 2 far outside exp's range).
A family's own kinds (Family.kinds: the delta rule's, families/delta/inputs.py) are
described in its folder; install_family_kinds admits them.
The values are drawn in float64 from a torch.Generator(seed), clipped to the dtype's range
and rounded to the dtype once; the implementation sees exactly those values.

Pair: the two inputs of a random-feature kernel estimate (stats/, strategies.kernel_pairs).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

from .inputs import UNIT_ROUNDOFF
from .specs import SpecError

KINDS = (
    "normal",
    "mean-values",
    "outlier-channels",
    "identical",
    "dominant",
    "zero-rows",
    "cancel",
    "negative-rows",
    "positive-rows",
    "large-norm",
)
# The kinds of the families' own (Family.kinds; install_family_kinds)
_FAMILY_KINDS: list[str] = []
CANCEL_OFFSET = 1000.0
DECAY_RATE = 1 / 16  # gamma = 0.94 (and 0.97, ...), about RetNet's 1 - 2^-5 .. 1 - 2^-9
CHANNEL_OCTAVES = 2.0  # the ratio of the rates of neighbouring key channels' gates
VALUE_MEAN = 4.0  # mean-values: a mean of a few standard deviations
OUTLIER_FACTOR = 10.0  # outlier-channels: "an order of magnitude larger"


def install_family_kinds(kinds: tuple[str, ...]) -> None:
    """Admit `kinds` beside KINDS in every Case made from now on: the families' own
    (families.registry installs them when linattn_verify is imported)."""
    _FAMILY_KINDS[:] = dict.fromkeys(kinds)


@dataclass(frozen=True)
class Case:
    """One input of the property suite; `tensors()` builds it."""

    b: int
    h: int
    n: int
    d: int
    dv: int
    dtype: str
    kind: str = "normal"
    magnitude: float = 1.0
    seed: int = 0
    m: int | None = None  # projection rows for the Performer maps
    device: str = "cpu"
    decay_rate: float = DECAY_RATE  # the mean -ln w per token of a decayed spec

    def __post_init__(self) -> None:
        sizes = (self.b, self.h, self.n, self.d, self.dv, self.seed, self.m or 1)
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in sizes):
            raise SpecError(f"case dimensions, m and seed must be integers: {self}")
        if not 0 <= self.seed < 2**63:
            raise SpecError(f"case seed must be in [0, 2^63), got {self.seed}")
        if self.m is not None and self.m < 1:
            raise SpecError(f"case m must be >= 1, got {self.m}")
        if not isinstance(self.device, str):
            raise SpecError(f"case device must be a string such as 'cpu', got {self.device!r}")
        if min(self.b, self.h, self.n, self.d, self.dv) < 1:
            raise SpecError(f"case dimensions must be >= 1: {self}")
        if self.dtype not in UNIT_ROUNDOFF:
            raise SpecError(f"case dtype {self.dtype!r}; known: {', '.join(UNIT_ROUNDOFF)}")
        if self.kind not in KINDS + tuple(_FAMILY_KINDS):
            known = ", ".join(KINDS + tuple(_FAMILY_KINDS))
            raise SpecError(f"case kind {self.kind!r}; known: {known}")
        if not isinstance(self.magnitude, int | float) or not 0 < self.magnitude < float("inf"):
            raise SpecError(f"case magnitude must be finite and > 0, got {self.magnitude!r}")
        if not isinstance(self.decay_rate, int | float) or not 0 < self.decay_rate < 1e6:
            raise SpecError(f"case decay_rate must be in (0, 1e6), got {self.decay_rate!r}")

    def __str__(self) -> str:
        m = f" m={self.m}" if self.m else ""
        rate = f" decay_rate={self.decay_rate:.3g}" if self.decay_rate != DECAY_RATE else ""
        return (
            f"B{self.b} H{self.h} N{self.n} d{self.d} dv{self.dv}{m} {self.dtype} "
            f"{self.kind} magnitude={self.magnitude:.3g} seed={self.seed} {self.device}{rate}"
        )

    def to_json(self) -> str:
        """The case as JSON (its decay_rate only where it is not the default)."""
        fields = asdict(self)
        if fields["decay_rate"] == DECAY_RATE:
            del fields["decay_rate"]
        return json.dumps(fields, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Case:
        try:
            fields = json.loads(text)
            return cls(**fields)
        except (ValueError, TypeError) as err:
            raise SpecError(f"not a case description: {text!r} ({err})") from None

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(q, k, v, W) in the case's dtype and device; W is None unless m is set."""
        return self.rounded(*self.float64_tensors())

    def float64_tensors(self) -> tuple[torch.Tensor | None, ...]:
        """(q, k, v, W) as drawn, in float64 before rounding."""
        gen = torch.Generator().manual_seed(self.seed)
        q, k, v = _draw(self, gen)
        w = None if self.m is None else torch.randn(self.m, self.d, generator=gen, **_F64)
        return q, k, v, w

    def rounded(self, *tensors: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        """float64 tensors clipped to the case's dtype's range, rounded to it, on its device."""
        dtype = getattr(torch, self.dtype)
        top = torch.finfo(dtype).max
        return tuple(
            None if t is None else t.clamp(-top, top).to(device=self.device, dtype=dtype)
            for t in tensors
        )

    def decay(self, kind: str | None) -> torch.Tensor | None:
        """The decay of a spec whose decay is `kind` (specs.DECAYS; None: no decay), in the
        case's dtype and device: gamma_h = exp(-decay_rate 2^-h) (H,), one rate an octave
        apart per head as RetNet's, or log-gates g = decay_rate ln U, U ~ U(0, 1] (B, H, N),
        of mean -decay_rate, drawn from their own generator (q, k, v are unchanged); channel
        gates (B, H, N, d) the same with key channel m's rate 2^(1 - m mod 4) decay_rate, so
        that every head mixes gates four octaves apart. gamma is kept at least the dtype's
        smallest normal."""
        if kind is None:
            return None
        dtype = getattr(torch, self.dtype)
        if kind == "constant":
            gamma = torch.exp(-self.decay_rate * 2.0 ** -torch.arange(self.h, **_F64))
            gamma = gamma.clamp(min=torch.finfo(dtype).tiny)
            return gamma.to(device=self.device, dtype=dtype)
        shape = (self.b, self.h, self.n, *([self.d] if kind == "channel-gates" else []))
        g = log_gates(torch.full((self.h,), self.decay_rate, **_F64), shape, self.seed)
        return g.clamp(min=-torch.finfo(dtype).max).to(device=self.device, dtype=dtype)


def log_gates(rates: torch.Tensor, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Log-gates rate_h ln U, U ~ U(0, 1] (mean -rate_h), float64 of `shape` (B, H, N), or
    (B, H, N, d) for channel gates, whose key channel m's rate is rate_h times
    CHANNEL_OCTAVES^(1 - m mod 4); rates (H,) per head; from their own generator (the
    seed's; q, k, v are unchanged)."""
    gen = torch.Generator().manual_seed(seed * 7919 + 1)
    uniform = 1.0 - torch.rand(*shape, generator=gen, **_F64)  # (0, 1]
    rate = rates.reshape(-1, *[1] * (len(shape) - 2))
    if len(shape) == 4:
        rate = rate * CHANNEL_OCTAVES ** -(torch.arange(shape[3], **_F64) % 4 - 1)
    return rate * torch.log(uniform)


def rated_decay(
    kind: str | None, rates: torch.Tensor, shape: tuple[int, ...], seed: int
) -> torch.Tensor | None:
    """The decay of a decay `kind` (None: no decay) from per-head rates (H,), float64, for
    inputs of `shape` (B, H, N, d): gamma_h = exp(-rate_h) (H,), or log-gates of those rates
    per token (log_gates: (B, H, N); channel gates (B, H, N, d))."""
    if kind is None:
        return None
    if kind == "constant":
        return torch.exp(-rates)
    b, h, n, d = shape
    return log_gates(rates, (b, h, n, *([d] if kind == "channel-gates" else [])), seed)


def constant_decay(kind: str | None, q: torch.Tensor) -> torch.Tensor | None:
    """The decay of a decay `kind` (None: no decay) for inputs q (B, H, N, d) that come from
    no case (the scaling runs), constant over tokens, in q's dtype and device: the cases'
    default decay (Case.decay at DECAY_RATE), gamma = exp(-DECAY_RATE) per head or gates of
    -DECAY_RATE."""
    if kind is None:
        return None
    shape = {"constant": q.shape[1:2], "gates": q.shape[:3], "channel-gates": q.shape}[kind]
    value = math.exp(-DECAY_RATE) if kind == "constant" else -DECAY_RATE
    return torch.full(shape, value, dtype=q.dtype, device=q.device)


_F64 = {"dtype": torch.float64}


def _rows(n: int, gen: torch.Generator, share: float = 1 / 3) -> torch.Tensor:
    """A boolean mask choosing about `share` of n rows, at least one."""
    pick = torch.rand(n, generator=gen) < share
    pick[int(torch.randint(n, (1,), generator=gen))] = True
    return pick


def _draw(case: Case, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    shape = (case.b, case.h, case.n)
    q = torch.randn(*shape, case.d, generator=gen, **_F64)
    k = torch.randn(*shape, case.d, generator=gen, **_F64)
    v = torch.randn(*shape, case.dv, generator=gen, **_F64)
    kind, mag = case.kind, case.magnitude
    if kind == "identical":
        q, k, v = (t[..., :1, :].expand_as(t).clone() for t in (q, k, v))
    elif kind == "dominant":
        j = int(torch.randint(case.n, (1,), generator=gen))
        k[..., j, :] = 4 * q.mean(dim=-2)
    elif kind == "zero-rows":
        q[..., _rows(case.n, gen), :] = 0.0
        k[..., _rows(case.n, gen), :] = 0.0
    elif kind == "cancel":
        signs = (-1.0) ** torch.arange(case.n, **_F64)
        v = v + CANCEL_OFFSET * signs[:, None]
    elif kind == "mean-values":
        v = v + VALUE_MEAN
    elif kind == "outlier-channels":
        channel = int(torch.randint(case.d, (1,), generator=gen))
        q[..., channel] *= OUTLIER_FACTOR
        k[..., channel] *= OUTLIER_FACTOR
    if kind in ("negative-rows", "positive-rows"):
        sign = -1.0 if kind == "negative-rows" else 1.0
        for t in (q, k):
            rows = _rows(case.n, gen)
            t[..., rows, :] = sign * (mag + t[..., rows, :].abs())
    elif kind == "large-norm":
        for t in (q, k):
            rows = _rows(case.n, gen)
            t[..., rows, :] *= mag / t[..., rows, :].norm(dim=-1, keepdim=True).clamp(min=1e-300)
    else:
        q, k = q * mag, k * mag
    return q, k, v


@dataclass(frozen=True)
class Pair:
    """The two inputs of a kernel estimate, already scaled (x' = x d^(-1/4)); label names a
    designed pair in messages instead of its entries."""

    x: np.ndarray
    y: np.ndarray
    label: str = ""

    def __str__(self) -> str:
        if self.label:
            plus, minus = np.linalg.norm(self.x + self.y), np.linalg.norm(self.x - self.y)
            return f"{self.label} (d={len(self.x)}, |x+y|={plus:.3g}, |x-y|={minus:.3g})"
        fmt = {"float_kind": lambda t: f"{t:.4g}"}
        x, y = (np.array2string(a, formatter=fmt, max_line_width=10**6) for a in (self.x, self.y))
        return f"x={x}, y={y}"
