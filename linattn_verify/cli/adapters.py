"""`adapters`: the third-party libraries behind the contract, whether each is installed
here, and the table of their expected verdicts (docs/adapters.md)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from ..adapters import ADAPTERS, AdapterUnavailable
from ..adapters.expected import EXPECTED_FILE, Expected, keys, load_expected, verdict_table
from ..adapters.expected import record as render
from ..vet import VetReport
from ..vet.verdicts import judged, measured_verdict
from . import options, vet
from .adapter_list import list_adapters

BEGIN, END = "<!-- adapter verdicts: begin -->", "<!-- adapter verdicts: end -->"


def add(sub) -> None:
    parser = options.command_parser(
        sub,
        "adapters",
        "the third-party adapters: their claims, which are installed, their verdicts",
        "List every adapter with the spec it claims, its layout, and whether its library "
        "is installed here (Triton kernels: in Triton's interpreter without CUDA). --table "
        "prints the "
        "expected verdicts (linattn_verify/adapters/expected.txt, checked by the test "
        "suite) as a Markdown table; --readme writes it into a page (docs/adapters.md) between "
        f"the lines {BEGIN} and {END}; --record vets every installed adapter (or those "
        "named) and rewrites expected.txt from the verdicts (minutes; in the interpreter a "
        "Triton kernel's default plan takes a few, and its variants as many again).",
        [
            "python -m linattn_verify adapters",
            "python -m linattn_verify adapters --table",
            "python -m linattn_verify adapters --readme docs/adapters.md",
            "python -m linattn_verify adapters --record fla.linear-attn-chunk",
            "python -m linattn_verify adapters --record 'fla.linear-attn-chunk --tf32 --dtypes "
            "float32'",
        ],
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--table", action="store_true", help="print the verdict table")
    what.add_argument("--readme", metavar="PATH", help="write the verdict table into PATH")
    what.add_argument(
        "--record",
        nargs="*",
        metavar="NAME",
        help="vet every installed adapter (or the NAMEs: an adapter, with its variants, or "
        "'NAME OPTIONS', one variant) and write expected.txt from what vet finds; the others "
        "keep their lines",
    )
    parser.set_defaults(func=run)


def record(names: list[str]) -> int:
    """Vet the named verdicts (an adapter's NAME: its default plan and its variants; "NAME
    OPTIONS": that variant alone; none named: every one) of the adapters that load here,
    and rewrite expected.txt with them; the other lines stay as the file has them when it
    is written, reasons and fixes kept. One torch thread, as the test suite runs
    (conftest.py): a matmul's rounding depends on how many threads split it, and a figure at
    the edge of a budget must come out the same in both."""
    torch.set_num_threads(1)
    every = keys(ADAPTERS)
    if unknown := sorted(set(names) - set(every)):
        name = unknown[0].split(" ", 1)[0]
        known = [k for k in every if k.split(" ", 1)[0] == name]
        hint = f"{name}'s: {', '.join(map(repr, known))}" if known else "`adapters` lists them"
        raise options.UsageError(f"no adapter or variant {unknown[0]!r}; {hint}")
    chosen = [k for k in every if not names or k in names or k.split(" ", 1)[0] in names]
    measured = {}
    for key in chosen:
        try:
            measured[key], report = verdict_of(key)
            print(f"{key}: {report.verdict}", flush=True)
        except AdapterUnavailable as err:
            print(f"{key}: kept as it was ({err})", flush=True)
    old = load_expected()  # as the file is now: another --record may have written it
    lines = {k: measured.get(k, old.get(k)) for k in every}
    staged = EXPECTED_FILE.with_name(f".expected.txt.{os.getpid()}.staged")
    staged.write_text(render({k: e for k, e in lines.items() if e is not None}, old))
    os.replace(staged, EXPECTED_FILE)
    print(f"{EXPECTED_FILE}: {len(measured)} verdicts recorded")
    return 0


def verdict_of(key: str) -> tuple[Expected, VetReport]:
    """expected.txt's facts for `key` (an adapter's name, or "NAME OPTIONS") and the report
    they come from: the default plan as vet.verdicts.measured_verdict runs it, a variant as
    `vet NAME OPTIONS --kat --no-envelope` does, with --long 0 unless it gives --long, a
    Triton kernel's with --triton interpret (recorded in the interpreter, CUDA or not)."""
    name, _, variant = key.partition(" ")
    if not variant:
        return measured_verdict(name)
    options = variant.split()
    interpreted = ["--triton", "interpret"] if ADAPTERS[name].triton else []
    short = [] if "--long" in options else ["--long", "0"]
    argv = [name, *options, *interpreted, "--kat", "--no-envelope", *short]
    impl, vet_options = vet.planned(vet.parse(argv), load=True)
    return judged(impl, vet_options)


def run(args: argparse.Namespace) -> int:
    if not (args.table or args.readme or args.record is not None):
        return list_adapters()
    if args.record is not None:
        return record(args.record)
    table = verdict_table(ADAPTERS, load_expected())
    if args.table:
        print(table)
        return 0
    path = Path(args.readme)
    text = path.read_text()
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise options.UsageError(f"{path} needs one line {BEGIN} and, after it, one line {END}")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    staged = path.with_name(f".{path.name}.staged")
    staged.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")
    os.replace(staged, path)
    print(f"{path}: the verdict table of {len(ADAPTERS)} adapters written")
    return 0
