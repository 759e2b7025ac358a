"""`vet`: one verdict on an implementation, from every check that applies."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence
from pathlib import Path

from ..checks.long_context import SMALLEST_LONGEST
from ..checks.search import THOROUGH_EXAMPLES, VET_EXAMPLES, VET_GRADIENT_EXAMPLES
from ..environment import environment
from ..grammar import checked, words
from ..run_options import RUN
from ..target import load_target
from ..under_test import Implementation
from ..vet import VetOptions, vet
from ..vet.repro import write_reproducers
from ..vet.runner import DEFAULT_TIMEOUT
from . import options
from .adapter_list import list_adapters


def add(sub) -> None:
    parser = options.command_parser(
        sub,
        "vet",
        "one verdict on an implementation: every check, figures, exit code",
        "Run every applicable check on TARGET in a worker process (an exception, a crash or "
        "a hang is a failed check): the property checks over the regime's corners and a "
        "Hypothesis search (N = 1, ragged N, B, H >= 2, d != dv, d = m, non-contiguous "
        "inputs, adversarial magnitudes), accuracy against the exact reference per dtype, "
        "cost scaling, and on request the known-answer vectors, a projection sampler's "
        "statistics and the backward; then the operating envelope per dtype. Failures are "
        "grouped into findings, each with its severity (wrong: outside the a-priori bound; "
        "inaccurate: within it, over the budget) and the regime of inputs it shows in. "
        + options.POLICY
        + " Exit 0 when the verdict passes, 1 when it fails, 2 for usage "
        "errors or a TARGET that cannot be loaded. " + options.CONTRACT,
        [
            "python -m linattn_verify vet mykernels.py:attn --feature-map elu --causal",
            "python -m linattn_verify vet mypkg.ops:favor --feature-map performer-positive \\",
            "    --sampler mypkg.ops:draw_w --claim orthogonal --json vet.json",
            "python -m linattn_verify vet fla.based-naive --kat",
            "python -m linattn_verify vet fla.linear-attn-chunk --smallest",
            "python -m linattn_verify vet mykernels.py:attn --feature-map elu --causal --grad",
            "python -m linattn_verify vet --form chunked --feature-map elu --causal",
            "python -m linattn_verify vet mykernels.py:gla --feature-map identity --causal \\",
            "    --no-normalize --scale d^-0.5 --decay channel-gates --state S --grad",
            "python -m linattn_verify vet mykernels.py:based --feature-map taylor --causal \\",
            "    --max-head-dim 16 --grad --even-dims-backward",
            "python -m linattn_verify vet mykernels.py:attn --feature-map elu --long 1048576",
            "python -m linattn_verify vet mykernels.py:attn --feature-map elu --causal --repro out",
            "python -m linattn_verify vet --list",
        ],
    )
    options.add_implementation(parser, positional=True)
    parser.add_argument("--list", action="store_true", help="list the adapters (as `adapters`)")
    options.add_dtypes(parser)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--sampler", help="module:function drawing W (m, d) from a Generator")
    parser.add_argument("--claim", choices=["iid", "orthogonal"], help="what --sampler's rows are")
    parser.add_argument("--kat", action="store_true", help="also the known-answer vectors")
    options.add(parser, RUN)  # --grad, --long
    parser.add_argument(
        "--thorough",
        action="store_true",
        help="search more cases a check: "
        + ", ".join(f"{n} {r}" for r, n in THOROUGH_EXAMPLES.items())
        + " (default "
        + ", ".join(f"{n} {r}" for r, n in VET_EXAMPLES.items())
        + "; the gradient checks "
        + ", ".join(f"{n} {r}" for r, n in VET_GRADIENT_EXAMPLES.items())
        + ")",
    )
    parser.add_argument(
        "--smallest",
        action="store_true",
        help="every check on one typical case per dtype, no search, long context to N = "
        f"{SMALLEST_LONGEST}: for kernels whose every call takes seconds (Triton's "
        "interpreter); the default plan is the verdict",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random-feature draws")
    parser.add_argument("--no-envelope", action="store_true", help="skip the envelope per dtype")
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="every check's line, the worst elements and every command (--json: every figure)",
    )
    options.add_policy(parser)
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds a task (default {DEFAULT_TIMEOUT:g})",
    )
    parser.add_argument(
        "--repro",
        metavar="DIR",
        help="write DIR/finding-<n>.py for each finding judged against the exact reference: "
        "a script that needs only torch and the kernel (its inputs in DIR/finding-<n>.pt) "
        "and fails where the kernel does; `--impl module:function` runs it on another",
    )
    options.add_output(parser)
    parser.set_defaults(func=run)


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """vet's arguments as `python -m linattn_verify vet ARGV` parses them."""
    parser = options.Parser(prog=options.PROG)
    add(parser.add_subparsers(parser_class=options.Parser))
    return parser.parse_args(["vet", *argv])


def planned(args: argparse.Namespace, load: bool = False) -> tuple[Implementation, VetOptions]:
    """The implementation vet's arguments name and the VetOptions they give (UsageError for
    arguments that do not fit); `load`: the implementation loaded here, for vet_in_process."""
    if args.target is None and args.form is None:
        raise options.UsageError(
            "vet needs TARGET (module:function, path.py:function or an adapter)"
        )
    declared = options.implementation(args, load=load)
    options.triton_check(declared, args.device)
    options.cuda_check(args.device)
    if args.timeout <= 0:
        raise options.UsageError(f"--timeout must be positive, got {args.timeout}")
    if args.repro and Path(args.repro).exists() and not Path(args.repro).is_dir():
        raise options.UsageError(f"--repro {args.repro}: not a folder")
    run_values = checked(RUN, vars(args), from_text=True)
    if args.sampler:
        if not declared.spec.info.needs_projection:
            raise options.UsageError(
                "--sampler is for the Performer specs, which take a projection"
            )
        if args.claim is None:
            raise options.UsageError("--sampler needs --claim iid or --claim orthogonal")
        load_target(args.sampler)  # a sampler that cannot be loaded is a usage error here
    vet_options = VetOptions(
        dtypes=tuple(args.dtypes),
        device=args.device,
        sampler=args.sampler,
        claim=args.claim,
        kat=args.kat,
        grad=run_values["grad"],
        thorough=args.thorough,
        seed=args.seed,
        timeout=args.timeout,
        fail_on=args.fail_on,
        strict=args.strict,
        envelope=not args.no_envelope,
        longest=run_values["longest"],
        long_grad=run_values["long_grad"],
        smallest=args.smallest,
    )
    return declared, vet_options


def run(args: argparse.Namespace) -> int:
    if args.list:
        return list_adapters()
    declared, vet_options = planned(args)
    run_values = checked(RUN, vars(args), from_text=True)
    report = vet(
        declared, vet_options, None if args.quiet else lambda t: options.progress(False, t)
    )
    print(report.summary(verbose=args.verbose))
    found = report.to_dict()
    if args.repro:
        written = write_reproducers(report, declared, Path(args.repro))
        print(written.summary())
        for number, finding in enumerate(found["findings"], 1):
            script = written.scripts.get(number)
            finding["reproducer"] = None if script is None else str(script)
        found["reproducers"] = written.to_dict()
    again = " ".join(filter(None, (declared.command, shlex.join(words(RUN, run_values)))))
    options.write_json(
        args.json,
        {
            **found,
            "reproduce": f"python -m linattn_verify vet {again}",
            "environment": environment(args.device),
        },
    )
    return 1 if report.failed else 0
