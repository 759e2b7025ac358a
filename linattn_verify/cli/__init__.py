"""Command line: `python -m linattn_verify COMMAND`, one module a command (`reference`:
exact.py, `known-answers`: known_answers.py); each command has --help with examples. What
they share is options.py; the adapters' list, adapter_list.py."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import accuracy, adapters, check, exact, known_answers, random_features, report, scaling
from . import vet as vet_command
from .options import ERRORS, PROG, Parser

COMMANDS = (
    report,
    vet_command,
    check,
    accuracy,
    exact,
    known_answers,
    scaling,
    random_features,
    adapters,
)


def build_parser() -> Parser:
    parser = Parser(
        prog=PROG,
        description="Numerical verification of linear attention against exact references.",
        epilog="Examples:\n"
        "  python -m linattn_verify report\n"
        "  python -m linattn_verify vet mykernels.py:attn --feature-map elu --causal\n"
        "  python -m linattn_verify check causality --impl mykernels.py:attn --feature-map elu "
        "--causal\n"
        "  python -m linattn_verify accuracy\n"
        "  python -m linattn_verify reference --random 1,1,4096,64,64 --feature-map elu --causal\n"
        "  python -m linattn_verify scaling --feature-map elu --causal --time\n"
        "  python -m linattn_verify random-features --sampler mysampler.py:draw --claim iid\n"
        "  python -m linattn_verify adapters\n"
        "Run `python -m linattn_verify COMMAND --help` for each command.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=Parser
    )
    for command in COMMANDS:
        command.add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
