"""Reproducers that leave the suite (`vet --repro DIR`): for each finding judged against the
exact reference, DIR/finding-<n>.py and its inputs DIR/finding-<n>.pt, a script that needs
Python, torch and the kernel's own code (repro_script.py). The inputs are those vet's check
built for the finding's case (the reference check's, or the decay check's at its rate),
recorded as the implementation received them: its layout and the keywords its spec gives
(g=, beta=, gamma=, projection=, initial_state=). The expected values are the exact
reference at the worst elements; the tolerance is the a-priori bound there for a wrong
finding (infinite where the bound is vacuous: a finite output passes, a non-finite one
fails), the budget there for an inaccurate one, each in units of roundoff times the
output's scale.

The kernel: a module:function or path.py:function target, or the library function an
adapter calls, as it is or through code of the adapter's own written once
(adapters.base.calling: fla's linear_attn kernels take features the caller maps, so the
script shows `kernel(torch.relu(q), torch.relu(k), v, normalize=True)[0]`); --impl replaces
the kernel and keeps that code. A Triton kernel's script (an adapter's of Triton kernels, or
a target vet ran in Triton's interpreter) runs it on a GPU when there is one, else in
Triton's interpreter on CPU tensors with two workarounds of a few lines for what the bare
interpreter does not do (the autotuner's first config, untimed: triton-lang/triton#7932;
`for i in range(n)` making i a tensor, as compiled code does: fla's chunk kernels call
i.to()), not the suite's shims; a finding the bare interpreter cannot show (bfloat16, held
as raw bits; TF32 products) gets a script that asks for a GPU.

A finding of another kind (a cost, a sampler, a crash, a hang), an adapter with other code
of its own around its call, and a built-in form get no script: the reason is said
instead."""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ..accuracy import K_BUDGET, Judgement
from ..adapters import ADAPTERS
from ..cases import Case
from ..checks.decay import judged_case
from ..families import case_arguments
from ..inputs import unit_roundoff
from ..target import split_target
from ..under_test import Implementation
from ..under_test.implementation import ImplementationFailure
from ..under_test.names import importable_name
from .findings import Finding, Row
from .outcome import VetReport
from .repro_script import CALL, CALL_AROUND, DEVICE, DEVICE_GPU, DEVICE_TRITON, SCRIPT

# the checks whose failing rows are judged against the exact reference, by the case each
# judges a row's case at (the accuracy task's rows are the reference check's)
JUDGED_AT = {"reference": lambda case: case, "decay": lambda case: judged_case(case)[1]}
PACKAGE = Path(__file__).resolve().parents[1]  # linattn_verify's own code: no adapter's library
# why a finding of another kind has no script (findings.KINDS)
NOT_JUDGED = {"cost": "a cost", "sampler": "a sampler", "rate": "the rate", "crashed": "a crash",
              "hung": "a hang"}  # fmt: skip


@dataclass(frozen=True)
class Reproducers:
    """The scripts written in `directory`, by finding number, and why each other finding has
    none."""

    directory: Path
    scripts: dict[int, Path]
    none: dict[int, str]

    def summary(self) -> str:
        """One line: the scripts in the directory and the findings without one."""
        if not self.scripts and not self.none:
            return f"reproducers: none in {self.directory} (no finding)"
        numbers = ", ".join(map(str, self.scripts))
        names = ", ".join(p.name for p in self.scripts.values())
        count = len(self.scripts)
        parts = [
            f"{count} script{'s' * (count != 1)} in {self.directory} (finding"
            f"{'s' * (count != 1)} {numbers}): {names}"
            if count
            else f"no script in {self.directory}"
        ]
        if self.none:
            reasons = "; ".join(f"{n}: {why}" for n, why in self.none.items())
            many = len(self.none) != 1
            parts.append(f"{len(self.none)} finding{'s' * many} ha{'ve' if many else 's'} none "
                         f"({reasons})")  # fmt: skip
        return "reproducers: " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "directory": str(self.directory),
            "scripts": {str(n): str(p) for n, p in self.scripts.items()},
            "none": {str(n): why for n, why in self.none.items()},
        }


@dataclass(frozen=True)
class _Kernel:
    """What a script loads and how it calls it: target, module:function or path.py:function;
    around, the code an adapter has around its call (adapters.base.calling: its call and
    why), None for the kernel called as it is; triton, its kernels are Triton's (on a GPU,
    else in Triton's interpreter); vetted, what vet was run on."""

    target: str
    vetted: str
    around: tuple[str, str] | None = None
    triton: bool = False


def write_reproducers(
    report: VetReport, impl: Implementation, directory: Path, root: Path | None = None
) -> Reproducers:
    """A script for each of report's findings that has one, in `directory` (created);
    `root`: the directory a module:function target is imported from (the current one)."""
    root = Path.cwd() if root is None else root
    directory.mkdir(parents=True, exist_ok=True)
    kernel, unsupported = _kernel(impl, root)
    scripts, none = {}, {}
    for number, finding in enumerate(report.findings, 1):
        rows = _judged_rows(report.rows, finding)
        why = NOT_JUDGED.get(finding.kind) or (
            "not judged against the exact reference" if not rows else unsupported
        )
        if why:
            none[number] = why
            continue
        scripts[number] = _write(number, finding, rows, impl, kernel, root, directory)
    return Reproducers(directory, scripts, none)


def _kernel(impl: Implementation, root: Path) -> tuple[_Kernel | None, str | None]:
    """The kernel the script loads (a path made absolute), or why there is none."""
    kind, name = impl.source.kind, impl.source.name
    triton = impl.triton is not None or (kind == "adapter" and ADAPTERS[name].triton)
    if kind == "adapter":
        return _library_function(impl, triton)
    if kind == "form":
        return None, "a built-in form of linattn_verify"
    if kind == "callable":
        name = importable_name(impl.fn)
        if name.startswith("<"):
            return None, f"the callable {name} cannot be imported by name"
    where, attr = split_target(name)
    if where.endswith(".py"):
        where = os.path.abspath(root / where)
    return _Kernel(f"{where}:{attr}", f"{where}:{attr}", triton=triton), None


def _library_function(impl: Implementation, triton: bool) -> tuple[_Kernel | None, str | None]:
    """The function an adapter calls, by module:function (path.py:function for a file its
    adapter loads by path, fla's naive.py files), called as it is or through the code the
    adapter has around it, written once (adapters.base.calling: relu features, a keyword);
    or why there is none: an adapter with other code of its own around its call."""
    adapter = ADAPTERS[impl.source.name]
    fn = (adapter.load_state if impl.state else adapter.load)()
    kernel = getattr(fn, "kernel", fn)
    try:
        source = inspect.getsourcefile(kernel)
    except TypeError:
        source = None
    if source is None or Path(source).resolve().is_relative_to(PACKAGE):
        return None, (
            "an adapter with code of its own around its library's call (scripts are written "
            "for module:function targets and adapters that call the library's function as "
            "is, or through code written once for the script to show: adapters.base.calling)"
        )
    module, name = kernel.__module__, kernel.__qualname__
    target = f"{source}:{name}" if module.startswith("_") else f"{module}:{name}"
    around = (fn.call, fn.why) if kernel is not fn else None
    return _Kernel(target, adapter.name, around, triton), None


def _judged_rows(rows: list[Row], finding: Finding) -> list[Row]:
    """The finding's failing rows judged against the exact reference at a worst element,
    those on the finding's case first."""
    judged = [
        r for r in rows
        if r["status"] == "fail" and r["name"] in finding.checks and r.get("case")
        and _check(r) in JUDGED_AT
        and (r.get("figures") or {}).get("worst_exact") is not None
    ]  # fmt: skip
    return sorted(judged, key=lambda r: r["case"] != finding.case)


def _check(row: Row) -> str:
    return "reference" if row["name"].startswith("accuracy ") else row["name"]


def _judged(row: Row) -> Case:
    return JUDGED_AT[_check(row)](Case.from_json(row["case"]))


class _Recorded(Exception):
    pass


def _recorded(impl: Implementation, case: Case) -> dict[str, Any]:
    """The arguments the implementation receives for `case` (args and kwargs, on the CPU):
    its call recorded, not run."""
    seen: dict[str, Any] = {}

    def record(*args, **kwargs):
        seen.update(args=list(args), kwargs=kwargs)
        raise _Recorded

    q, k, v, w, decay = case_arguments(case, impl.spec)
    with contextlib.suppress(ImplementationFailure):  # _Recorded, raised once it is seen
        replace(impl, fn=record)(q, k, v, w, decay)
    return _cpu(seen)


def _cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True).contiguous()
    if isinstance(value, dict):
        return {k: _cpu(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return type(value)(_cpu(v) for v in value)
    return value


def _literal(x: float) -> str:
    if math.isnan(x):
        return "math.nan"
    if math.isinf(x):
        return "math.inf" if x > 0 else "-math.inf"
    return f"{x:.17g}"


def _tolerances(
    rows: list[Row], judgement: Judgement, dtype: str
) -> tuple[list[tuple[tuple[int, ...], float, float]], list[str]]:
    """(index, exact, tolerance) at each row's worst element, and why each tolerance."""
    scale, bound = judgement.bound(dtype)
    u = unit_roundoff(dtype, judgement.spec)
    elements, why = [], []
    for row in rows:
        at = tuple(row["figures"]["worst_index"])
        if at in (e[0] for e in elements):
            continue
        s, exact, seen = float(scale[at]), float(judgement.ref[at]), row["figures"]["worst_output"]
        if row.get("severity") == "inaccurate":
            units = float(row["figures"]["budget"])
            what = (f"the budget there, {units:.4g} units of roundoff: {K_BUDGET:g} times what "
                    f"linattn_verify's careful evaluation attains in {dtype}; more is less "
                    f"accurate than {dtype} allows")  # fmt: skip
        elif math.isinf(bound[at]):  # as judge reads it (at s = 0 too): any finite output
            elements.append((at, exact, math.inf))
            why.append(
                f"{at}: the a-priori floating-point bound there is vacuous in {dtype} (n u >= "
                f"1, or the denominator within its error of 0): any finite output is within "
                f"it, and a non-finite one is wrong all the same (the exact value is finite); "
                f"vet's run gave {seen!r} there"
            )
            continue
        else:
            units = float(bound[at])
            what = (f"the a-priori floating-point bound there, {units:.4g} units of roundoff: "
                    f"any sane evaluation in {dtype} is within it, more is a bug")  # fmt: skip
        elements.append((at, exact, units * u * s))
        why.append(
            f"{at}: {what}; one unit is u = 2^{math.log2(u):g} ({dtype}) times the output's "
            f"scale there, s = {s:.6g} (the magnitude the sums work at), so the tolerance is "
            f"{units * u * s:.6g}; vet's run gave {seen!r} there"
        )
    return elements, why


def _comment(lines: list[str], width: int = 92) -> str:
    """Lines as # comments wrapped at `width`."""
    wrap = textwrap.TextWrapper(width, initial_indent="# ", subsequent_indent="#   ")
    return "".join(wrap.fill(line) + "\n" for line in lines)


def _device(kernel: _Kernel, impl: Implementation, case: Case) -> str:
    """The script's DEVICE and what a Triton kernel needs to run (repro_script.DEVICE_*)."""
    if not kernel.triton:
        return DEVICE.substitute(device_literal=json.dumps(case.device))
    if case.dtype == "bfloat16":
        why = "Triton's interpreter holds bfloat16 as raw bits (triton-lang/triton#11584)"
    elif impl.tf32:
        why = "vet judged TF32 products (--tf32), a GPU's; the interpreter's are IEEE float32"
    else:
        return DEVICE_TRITON
    comment = _comment([f"Its kernels are Triton's, and this finding needs a GPU: {why}."])
    return DEVICE_GPU.substitute(comment=comment.rstrip("\n"), why=why)


def _call(kernel: _Kernel) -> tuple[str, str]:
    """The script's call() (repro_script.CALL*) and what its docstring says of it."""
    if kernel.around is None:
        return CALL, ""
    call, why = kernel.around
    said = (f"call() below is the code vet's adapter {kernel.vetted} has around the kernel, "
            f"as it runs it; --impl replaces the kernel, not that code.")  # fmt: skip
    docstring = textwrap.fill(why + '"""', 92, initial_indent='    """', subsequent_indent="    ")
    return CALL_AROUND.substitute(docstring=docstring, call=call), f"\n{textwrap.fill(said, 92)}\n"


def _write(
    number: int,
    finding: Finding,
    rows: list[Row],
    impl: Implementation,
    kernel: _Kernel,
    root: Path,
    directory: Path,
) -> Path:
    """DIR/finding-<number>.py and its inputs DIR/finding-<number>.pt."""
    case = _judged(rows[0])
    rows = [r for r in rows if r["case"] == rows[0]["case"] and _check(r) == _check(rows[0])]
    script, inputs = directory / f"finding-{number}.py", directory / f"finding-{number}.pt"
    torch.save(_recorded(impl, case), inputs)
    elements, why = _tolerances(rows, Judgement.of_case(case, impl.spec), case.dtype)
    expected = "".join(f"    ({at}, {_literal(x)}, {_literal(t)}),\n" for at, x, t in elements)
    call, called = _call(kernel)
    script.write_text(
        SCRIPT.substitute(
            number=number,
            vetted=kernel.vetted,
            headline=textwrap.fill(finding.headline(), 92),
            inputs=inputs.name,
            script=script.name,
            called=called,
            case=case.to_json(),
            reproduce=rows[0].get("reproduce") or "",
            target_literal=json.dumps(kernel.target),
            root_literal=json.dumps(str(root.resolve())),
            inputs_literal=json.dumps(inputs.name),
            layout_literal=json.dumps(impl.layout),
            device=_device(kernel, impl, case),
            expected=expected,
            why=_comment(["The tolerance at each element and why:", *why]),
            call=call,
        )
    )
    return script
