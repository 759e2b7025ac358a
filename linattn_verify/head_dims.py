"""The head dimensions a kernel declares it takes (docs/contract.md, "Declared limits"): a
largest d, q's and k's (--max-head-dim; fla's fused_chunk_based asserts q.shape[-1] <= 16),
and even d and dv in float16 and bfloat16 backward passes (--even-dims-backward; fla's
chunk_bwd_dv asserts `K % 2 == 0 and V % 2 == 0` there, fla/ops/common/chunk_o.py:606).
`fit` is the one rule every case meets: the checks fit theirs, and the tasks that fix a d
of their own (scaling, the long-context panels) ask `d`."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .cases import Case
from .specs import SpecError

SIXTEEN_BIT = ("float16", "bfloat16")


@dataclass(frozen=True)
class HeadDims:
    """largest: the largest d it takes (None: any); even_backward: its backward passes in
    float16 and bfloat16 take even d and dv alone."""

    largest: int | None = None
    even_backward: bool = False

    def __post_init__(self) -> None:
        if self.largest is not None and (not isinstance(self.largest, int) or self.largest < 1):
            raise SpecError(f"the largest head dimension must be an integer >= 1: {self.largest}")
        if self.largest == 1 and self.even_backward:
            raise SpecError("d <= 1 with even d in 16-bit backward passes leaves no d to take")

    @property
    def declared(self) -> bool:
        return self.largest is not None or self.even_backward

    def _even(self, dtype: str, backward: bool) -> bool:
        return self.even_backward and backward and dtype in SIXTEEN_BIT

    def d(self, d: int, dtype: str = "float32", backward: bool = False) -> int:
        """The d nearest `d` it takes: at most the largest, and an odd one made even in a
        16-bit backward pass (one more, or one less at the largest)."""
        if self.largest is not None:
            d = min(d, self.largest)
        if self._even(dtype, backward) and d % 2:
            d += 1 if d != self.largest else -1
        return d

    def dv(self, dv: int, dtype: str = "float32", backward: bool = False) -> int:
        """The dv nearest `dv` it takes: one more where an odd one is refused."""
        return dv + (self._even(dtype, backward) and dv % 2)

    def fit(self, case: Case, backward: bool = False) -> Case:
        """`case` with the d and dv it takes (the case itself when it takes them)."""
        d, dv = self.d(case.d, case.dtype, backward), self.dv(case.dv, case.dtype, backward)
        return case if (d, dv) == (case.d, case.dv) else replace(case, d=d, dv=dv)

    def __str__(self) -> str:
        words = [f"d <= {self.largest}"] * (self.largest is not None)
        words += ["even d and dv in float16 and bfloat16 backward passes"] * self.even_backward
        return "; ".join(words)


UNDECLARED = HeadDims()  # any head dimension: no limit declared
