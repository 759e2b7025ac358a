"""The requests of vet's plan (runner.plan): a Task, one frozen dataclass a kind of work,
picklable (it crosses to the worker process, worker.py), its fields the parameters of the
function in tasks.py that does the work, so that a parameter can be followed from the
command line to the kernel's call by reading."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar

from ..checks import gradient_length as gradient_length_check
from ..checks import long_context as long_context_check
from ..specs import Spec
from ..strategies import corner_cases
from ..under_test import Implementation
from .envelope import envelope
from .tasks import (
    AUTOTUNE_CONFIGS,
    INT32_OFFSETS,
    SCALING_MAX_N,
    Row,
    accuracy,
    accuracy_panel,
    autotune_configs,
    gradient_length,
    int32_offsets,
    known_answers,
    long_context,
    outside_claim,
    probe_head_dims,
    property_check,
    rate,
    sampler_statistics,
    scaling,
    tf32_dots,
    vet_cases,
)


@dataclass(frozen=True, kw_only=True)
class Task(abc.ABC):
    """A unit of work as vet's plan asks for it (runner.plan): its parameters, frozen and
    picklable (it crosses to the worker process), and run(impl), the rows it gives. Each
    kind has a `name`, the plan's step and the row it gives (a check's name for
    PropertyCheck, else the kind's). features: the bounds' feature model while it runs
    (accuracy/bound.py: "relative" for vet --strict)."""

    features: str = "standard"

    @abc.abstractmethod
    def run(self, impl: Implementation) -> list[Row]:
        """The rows of this work on `impl`."""

    def planned_cases(self, spec: Spec) -> int | None:
        """The most cases it runs a check on, for progress (worker.py counts them alike):
        fewer when a search stops at a failure; the cases that shrink a failure or check
        one again are beyond them (checks.core.beyond_plan). None for the tasks that run
        none through a check."""
        return None


@dataclass(frozen=True, kw_only=True)
class Tf32Dots(Task):
    """tf32_dots: the tl.dots with TF32 products one float32 call runs (no check's row)."""

    name: ClassVar[str] = "tf32-dots"
    device: str

    def run(self, impl: Implementation) -> list[Row]:
        return tf32_dots(impl, self.device)


@dataclass(frozen=True, kw_only=True)
class OutsideClaim(Task):
    """outside_claim: one call on each dtype the library does not claim, and just past the
    head dimensions it takes (`judged`: the dtypes judged; grad: its backward too)."""

    name: ClassVar[str] = "outside the claim"
    device: str
    dtypes: tuple[str, ...]
    judged: tuple[str, ...]
    grad: bool = False

    def run(self, impl: Implementation) -> list[Row]:
        return outside_claim(impl, self.device, self.dtypes, self.judged, self.grad)


@dataclass(frozen=True, kw_only=True)
class HeadDimsProbe(Task):
    """probe_head_dims: the evidence of an undeclared limit on the head dimensions."""

    name: ClassVar[str] = "head-dims-probe"
    device: str
    dtype: str
    raised: int | None = None
    odd: str | None = None

    def run(self, impl: Implementation) -> list[Row]:
        return probe_head_dims(impl, self.device, self.dtype, self.raised, self.odd)


@dataclass(frozen=True, kw_only=True)
class PropertyCheck(Task):
    """property_check: check `name` searched per regime (smallest: smallest_cases alone)."""

    name: str
    examples: dict[str, int]
    device: str
    dtypes: tuple[str, ...]
    smallest: bool = False
    past_contract: str | None = None

    def run(self, impl: Implementation) -> list[Row]:
        return property_check(
            impl, self.name, self.device, self.examples, self.dtypes, self.past_contract,
            self.smallest,
        )  # fmt: skip

    def planned_cases(self, spec: Spec) -> int | None:
        if self.smallest:
            return len(self.dtypes)
        fixed = len(corner_cases(spec, self.dtypes, self.device))
        fixed += len(vet_cases(spec, self.dtypes, self.device))
        return fixed + sum(self.examples.values())


@dataclass(frozen=True, kw_only=True)
class Accuracy(Task):
    """accuracy: the reference check on each dtype's panel."""

    name: ClassVar[str] = "accuracy"
    device: str
    dtypes: tuple[str, ...]
    smallest: bool = False
    past_contract: str | None = None

    def run(self, impl: Implementation) -> list[Row]:
        return accuracy(impl, self.device, self.dtypes, self.past_contract, self.smallest)

    def planned_cases(self, spec: Spec) -> int | None:
        if self.smallest:
            return len(self.dtypes)
        return sum(len(accuracy_panel(spec, dtype, self.device)) for dtype in self.dtypes)


@dataclass(frozen=True, kw_only=True)
class AutotuneConfigs(Task):
    """autotune_configs: a Triton kernel in the interpreter, in its other autotune configs."""

    name: ClassVar[str] = AUTOTUNE_CONFIGS
    device: str
    dtypes: tuple[str, ...]
    smallest: bool = False

    def run(self, impl: Implementation) -> list[Row]:
        return autotune_configs(impl, self.device, self.dtypes, self.smallest)


@dataclass(frozen=True, kw_only=True)
class Int32Offsets(Task):
    """int32_offsets: a Triton kernel's pointer offsets that wrap at 2^31."""

    name: ClassVar[str] = INT32_OFFSETS
    device: str

    def run(self, impl: Implementation) -> list[Row]:
        return int32_offsets(impl, self.device)


@dataclass(frozen=True, kw_only=True)
class Scaling(Task):
    """scaling: the counted growth against the `expected` one, up to max_n, on inputs of
    `dtype` (float32, or the first dtype vet judges where float32 is not among them)."""

    name: ClassVar[str] = "scaling"
    device: str
    expected: str
    max_n: int = SCALING_MAX_N
    dtype: str = "float32"

    def run(self, impl: Implementation) -> list[Row]:
        return scaling(impl, self.device, self.expected, self.max_n, self.dtype)


@dataclass(frozen=True, kw_only=True)
class LongContext(Task):
    """long_context: the long-context check up to N = longest."""

    name: ClassVar[str] = long_context_check.NAME
    device: str
    dtypes: tuple[str, ...]
    longest: int
    seed: int

    def run(self, impl: Implementation) -> list[Row]:
        return long_context(impl, self.device, self.dtypes, self.longest, self.seed)


@dataclass(frozen=True, kw_only=True)
class GradientLength(Task):
    """gradient_length: the backward at length up to N = longest."""

    name: ClassVar[str] = gradient_length_check.NAME
    device: str
    dtypes: tuple[str, ...]
    longest: int
    seed: int

    def run(self, impl: Implementation) -> list[Row]:
        return gradient_length(impl, self.device, self.dtypes, self.longest, self.seed)


@dataclass(frozen=True, kw_only=True)
class KnownAnswers(Task):
    """known_answers: the known-answer vectors of the spec in `dtypes`."""

    name: ClassVar[str] = "known-answers"
    device: str
    dtypes: tuple[str, ...]

    def run(self, impl: Implementation) -> list[Row]:
        return known_answers(impl, self.device, self.dtypes)


@dataclass(frozen=True, kw_only=True)
class SamplerStatistics(Task):
    """sampler_statistics: the random-feature panel on a sampler (not on the implementation)."""

    name: ClassVar[str] = "sampler"
    sampler_target: str
    claim: str
    seed: int

    def run(self, impl: Implementation) -> list[Row]:
        return sampler_statistics(self.sampler_target, self.claim, self.seed)


@dataclass(frozen=True, kw_only=True)
class Rate(Task):
    """rate: the attention error's rate in m, W from the sampler (None: the project's iid)."""

    name: ClassVar[str] = "rate"
    sampler_target: str | None
    claim: str | None
    seed: int
    device: str
    dtypes: tuple[str, ...]

    def run(self, impl: Implementation) -> list[Row]:
        return rate(impl, self.sampler_target, self.seed, self.device, self.dtypes, self.claim)


@dataclass(frozen=True, kw_only=True)
class Envelope(Task):
    """envelope.envelope: the operating envelope per dtype."""

    name: ClassVar[str] = "envelope"
    device: str
    dtypes: tuple[str, ...]

    def run(self, impl: Implementation) -> list[Row]:
        return envelope(impl, self.device, self.dtypes)
