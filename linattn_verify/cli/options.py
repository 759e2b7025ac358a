"""What the commands share: the option groups (the implementation and its claim, the
output), the usage error, progress and JSON output. Defined once, used by every command."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..adapters import ADAPTERS
from ..grammar import Option
from ..jsonable import dumps
from ..regimes import REGIMES
from ..specs import FEATURE_MAPS, SpecError
from ..under_test import Implementation, from_options
from ..under_test.claim import CLAIM, SOURCE

PROG = "python -m linattn_verify"
DTYPES = ("float16", "bfloat16", "float32", "float64")
TARGET_HELP = (
    "module:function, path/file.py:function, or an adapter of a third-party library "
    "(python -m linattn_verify adapters); without one, the built-in --form"
)
CONTRACT = (
    "The contract: fn(q, k, v) -> out, or fn(q, k, v, projection=W) for the Performer maps; "
    "q, k: (B, H, N, d), v: (B, H, N, dv) torch tensors of one dtype and device (--layout "
    "bnhd: (B, N, H, d)); out: (B, H, N, dv) in the inputs' dtype and device. Errors are in "
    "units of u s: u the unit roundoff of the dtype (2^-11 float16, 2^-8 bfloat16, 2^-24 "
    "float32, 2^-53 float64), s the magnitude the output works at (the weighted mean of "
    "|v|); see docs/accuracy.md."
)


class UsageError(Exception):
    """A bad argument: printed as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    """argparse with a usage error as one line on stderr and exit code 2 (no usage block)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"error: {self.prog}: {message}", file=sys.stderr)
        sys.exit(2)


def command_parser(sub: Any, name: str, summary: str, description: str, examples: Sequence[str]):
    """A subcommand with --help text: what it does, then its examples."""
    return sub.add_parser(
        name,
        help=summary,
        description=description,
        epilog="Examples:\n" + "\n".join(f"  {e}" for e in examples),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_implementation(parser: argparse.ArgumentParser, positional: bool) -> None:
    """TARGET (a positional argument, or --impl), the options that choose a built-in form
    instead and those of what it claims (under_test.claim)."""
    if positional:
        parser.add_argument("target", nargs="?", metavar="TARGET", help=TARGET_HELP)
    else:
        parser.add_argument("--impl", dest="target", metavar="TARGET", help=TARGET_HELP)
    add(parser.add_argument_group("the implementation and what it claims"), (*SOURCE, *CLAIM))


def add(group: Any, options: Sequence[Option]) -> None:
    """The arguments of these grammar.Option records."""
    for option in options:
        group.add_argument(option.flag, **option.arguments())


def implementation(args: argparse.Namespace, load: bool = True) -> Implementation:
    """The Implementation the arguments name (under_test.from_options)."""
    return from_options(args.target, vars(args), load)


POLICY = (
    "By default the verdict fails on a finding in typical inputs (what trained models feed); "
    "findings in stress and extreme inputs are robustness warnings. --fail-on stress or "
    "extreme widens that; --strict fails on every regime and holds elu features to relative "
    "accuracy (regimes: docs/regimes.md)."
)


def add_policy(parser: argparse.ArgumentParser) -> None:
    """--fail-on REGIME and --strict: which findings fail the verdict."""
    parser.add_argument(
        "--fail-on",
        choices=REGIMES,
        default="typical",
        help="fail on findings in this regime and milder ones (default typical)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="fail on every regime, elu features held to relative accuracy",
    )


def add_output(parser: argparse.ArgumentParser) -> None:
    """--json and --quiet, which every command has."""
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def add_specs(parser: argparse.ArgumentParser, what: str) -> None:
    """--specs NAME ... (the built-in specs to run)."""
    parser.add_argument(
        "--specs",
        nargs="+",
        choices=list(FEATURE_MAPS),
        metavar="NAME",
        help=f"{what} (default: all): " + ", ".join(FEATURE_MAPS),
    )


def add_dtypes(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dtypes",
        nargs="+",
        choices=DTYPES,
        default=list(DTYPES),
        metavar="DTYPE",
        help="dtypes (default: all): " + ", ".join(DTYPES),
    )


def progress(quiet: bool, text: str) -> None:
    if not quiet:
        print(text, file=sys.stderr, flush=True)


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(dumps(payload))


def check_writable(path: Path, option: str = "--json") -> None:
    """A path whose folder cannot take a file fails now, not after the run."""
    folder = path.parent
    if path.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK):
        raise UsageError(f"{option} {path}: cannot write a file there")


def cuda_check(device: str | None) -> None:
    """UsageError when `device` is CUDA and torch sees none."""
    if device and device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"device {device!r} asked for, but torch sees no CUDA device")


def triton_check(impl: Implementation, device: str) -> None:
    """UsageError when Triton code is asked to run where it cannot: natively on CPU tensors
    (a Triton adapter on a machine with CUDA, --device cpu), or in the interpreter on CUDA."""
    kind, name = impl.source.kind, impl.source.name
    if impl.triton == "interpret" and device != "cpu":
        raise UsageError(
            "Triton's interpreter (--triton interpret, a Triton adapter's way without a CUDA "
            f"device) runs the kernels on CPU tensors: drop --device {device}"
        )
    if kind == "adapter" and ADAPTERS[name].triton and impl.triton is None and device == "cpu":
        raise UsageError(f"{name} is Triton code: give --device cuda or --triton interpret")


def shape(text: str) -> tuple[int, ...]:
    """B,H,N,d,dv of five positive integers."""
    try:
        dims = tuple(int(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected B,H,N,d,dv integers, got {text!r}") from None
    if len(dims) != 5 or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"expected five positive integers B,H,N,d,dv: {text!r}")
    return dims


ERRORS = (UsageError, SpecError, OSError)
