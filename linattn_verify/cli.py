"""Command line: `python -m linattn_verify COMMAND`; each command has --help with examples."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .jsonable import dumps
from .specs import FEATURE_MAPS, Spec, SpecError

DTYPES = ("float16", "bfloat16", "float32", "float64")
# the names of linattn_verify.checks.CHECKS and GRAD_CHECKS, listed here so that --help
# does not import torch
CHECK_NAMES = (
    "contract", "reference", "associativity", "positivity", "convex-hull", "v-affine",
    "permutation", "causality", "batch-head", "layout", "split-resume",
)  # fmt: skip
GRAD_CHECK_NAMES = (
    "gradient", "gradient-causality", "gradient-associativity", "gradient-finite",
)  # fmt: skip


class UsageError(Exception):
    """A bad argument: printed as one line, exit code 2."""


def _progress(quiet: bool, text: str) -> None:
    if not quiet:
        print(text, file=sys.stderr, flush=True)


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected B,H,N,d,dv integers, got {text!r}") from None
    if len(dims) != 5 or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"expected five positive integers B,H,N,d,dv: {text!r}")
    return dims


def _write_json(path: str | None, payload: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(dumps(payload))


def _random_inputs(shape: Sequence[int], seed: int, m: int | None) -> dict[str, np.ndarray]:
    b, h, n, d, dv = shape
    rng = np.random.default_rng(seed)
    arrays = {
        "q": rng.standard_normal((b, h, n, d)),
        "k": rng.standard_normal((b, h, n, d)),
        "v": rng.standard_normal((b, h, n, dv)),
    }
    if m:
        from .sampling import sample_projection

        arrays["projection"] = sample_projection(m, d, "orthogonal", seed)
    return arrays


def cmd_reference(args: argparse.Namespace) -> int:
    from .inputs import validate
    from .reference import exact

    spec = Spec(args.feature_map, causal=args.causal, eps=args.eps)
    if args.input:
        try:
            with np.load(args.input) as f:
                arrays = {name: f[name] for name in f.files}
        except (OSError, ValueError) as err:
            raise UsageError(f"cannot read {args.input}: {err}") from None
        missing = {"q", "k", "v"} - set(arrays)
        if missing:
            raise UsageError(f"{args.input} lacks arrays {sorted(missing)} (need q, k, v)")
    else:
        d = args.random[3]
        arrays = _random_inputs(args.random, args.seed, d if spec.info.needs_projection else None)
    x = validate(arrays["q"], arrays["k"], arrays["v"], spec, arrays.get("projection"))
    _progress(args.quiet, f"computing the exact {spec} reference for shape {x.shape} ...")
    start = time.perf_counter()
    out = exact(x, spec, args.engine)
    seconds = time.perf_counter() - start
    if args.out:
        np.savez(args.out, out=out)
    summary = {
        "spec": str(spec),
        "shape_B_H_Nq_Nk_d_dv": list(x.shape),
        "engine": args.engine,
        "seconds": seconds,
        "output": args.out,
        "undefined_0_over_0": int(np.isnan(out).sum()),
    }
    print(
        f"{spec}: exact output {out.shape} in {seconds:.2f} s"
        + (f" -> {args.out}" if args.out else "")
    )
    _write_json(args.json, summary)
    return 0


def cmd_accuracy(args: argparse.Namespace) -> int:
    import torch

    from .accuracy import judge
    from .implementations import GOLDEN_FORMS, golden_attention
    from .inputs import validate
    from .reference import exact

    for name in args.specs:
        if name not in FEATURE_MAPS:
            raise UsageError(f"unknown feature map {name!r}; known: {', '.join(FEATURE_MAPS)}")
    b, h, n, d, dv = args.shape
    rows, start = [], time.perf_counter()
    cases = [(s, c, t) for s in args.specs for c in (False, True) for t in args.dtypes]
    for index, (name, causal, dtype) in enumerate(cases, 1):
        spec = Spec(name, causal=causal)
        arrays = _random_inputs(args.shape, args.seed, d if spec.info.needs_projection else None)
        tensors = {k: torch.tensor(a).to(getattr(torch, dtype)) for k, a in arrays.items()}
        x = validate(tensors["q"], tensors["k"], tensors["v"], spec, tensors.get("projection"))
        ref = exact(x, spec)
        forms = ("quadratic",) if not spec.info.kernelised else GOLDEN_FORMS
        for form in forms:
            out = golden_attention(**tensors, spec=spec, form=form)
            verdict = judge(out, x, spec, ref)
            rows.append({"form": form, **verdict.to_dict()})
        _progress(args.quiet, f"[{index}/{len(cases)}] {spec} {dtype}")
    failed = [r for r in rows if not r["passed"]]
    print(
        f"golden implementation vs exact reference, shape B,H,N,d,dv = {b},{h},{n},{d},{dv}, "
        f"seed {args.seed}; errors in units of u * s (DESIGN 'Accuracy')\n"
    )
    print("| spec | form | dtype | max error | p99 | bound at worst | verdict |")
    print("|---|---|---|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['spec']} | {r['form']} | {r['dtype']} | {r['max_error']:.3g} | "
            f"{r['p99_error']:.3g} | {r['bound_at_worst']:.3g} | "
            f"{'pass' if r['passed'] else 'FAIL'} |"
        )
    print(
        f"\n{len(rows) - len(failed)} passed, {len(failed)} failed "
        f"in {time.perf_counter() - start:.1f} s"
    )
    _write_json(args.json, {"shape": list(args.shape), "seed": args.seed, "cases": rows})
    return 1 if failed else 0


def cmd_scaling(args: argparse.Namespace) -> int:
    import torch

    from .implementations import attention, sample_projection_torch
    from .scaling import attention_inputs, plot_scaling, scaling_result
    from .target import load_target

    spec = Spec(args.feature_map, causal=args.causal)
    if args.target:
        fn, label = load_target(args.target), args.target
    else:
        label = f"built-in {spec}"

        def fn(q, k, v, projection=None):
            return attention(q, k, v, spec.feature_map, spec.causal, projection=projection)

    w = None
    if spec.info.needs_projection:
        w = sample_projection_torch(
            args.d, args.d, "orthogonal", torch.Generator().manual_seed(args.seed)
        )
    impl = fn if w is None else (lambda q, k, v: fn(q, k, v, projection=w))
    top = args.max_n.bit_length() - 1
    if top < 10:
        raise UsageError(f"--max-n must be at least 1024 to fit a slope, got {args.max_n}")
    if args.repeats < 1 or args.d < 1:
        raise UsageError(f"--repeats and --d must be positive, got {args.repeats}, {args.d}")
    try:  # one small call first: an implementation that fails at all fails here, by name
        impl(*attention_inputs(256, d=args.d, dv=args.d))
    except Exception as err:
        print(f"error: {label} raised {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    cost_ns = [2**i for i in range(8, top + 1)]
    time_ns = [2**i for i in range(max(8, top - 6), top + 1)] if args.time else None
    _progress(args.quiet, f"counting FLOPs and bytes of {label} over N = 256 ... {2**top}")
    try:
        result = scaling_result(
            label,
            impl,
            args.expect,
            cost_ns,
            time_ns,
            spec.causal,
            args.repeats,
            d=args.d,
            dv=args.d,
        )
    except Exception as err:  # e.g. out of memory at a large N: a failed check, by name
        print(f"error: {label} failed while measured: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    summary = result.summary()
    print(f"{label}: {result.growth.message} -> {'pass' if result.growth.passed else 'FAIL'}")
    if result.timing is not None:
        t = result.timing
        print(
            f"time ~ N^{t.fit.slope:.2f} over N={t.ns[len(t.ns) // 2]}..{t.ns[-1]} ({t.status}"
            f"{': ' + t.reason if t.reason else ''}); crossover vs SDPA: "
            f"{result.crossover_vs_sdpa or 'none measured'}"
        )
        Path(args.out).mkdir(parents=True, exist_ok=True)
        png = plot_scaling(
            {label: t} | ({"sdpa": result.sdpa_timing} if result.sdpa_timing else {}),
            {label: result.costs},
            Path(args.out) / "scaling.png",
        )
        print(f"plot: {png}")
    _write_json(args.json, summary)
    return 0 if result.growth.passed else 1


def cmd_check(args: argparse.Namespace) -> int:
    import torch

    from .adapters import ADAPTERS, adapter_implementation
    from .cases import Case
    from .checks import ALL_CHECKS, CHECKS, builtin, external, not_applicable
    from .checks.search import find_failure
    from .implementations.forms import FORMS

    if args.impl in ADAPTERS:
        if args.feature_map or args.causal or args.eps or args.layout or args.chunk_size:
            raise UsageError(f"{args.impl} is an adapter: its spec and layout are its claim")
        impl = adapter_implementation(ADAPTERS[args.impl])
    elif args.feature_map is None:
        raise UsageError("check needs --feature-map NAME (the spec of the implementation)")
    elif args.impl:
        if args.chunk_size is not None:
            raise UsageError("--chunk-size is for the built-in forms, not --impl")
        spec = Spec(args.feature_map, causal=args.causal, eps=args.eps)
        impl = external(args.impl, spec, args.layout or "bhnd")
    else:
        if args.layout is not None:
            raise UsageError("--layout describes --impl; the built-in forms take (B, H, N, d)")
        if args.form not in FORMS:
            raise UsageError(f"unknown form {args.form!r}; forms: {', '.join(FORMS)}")
        if args.chunk_size is not None and args.chunk_size < 1:
            raise UsageError(f"--chunk-size must be >= 1, got {args.chunk_size}")
        spec = Spec(args.feature_map, causal=args.causal, eps=args.eps)
        impl = builtin(spec, args.form, args.chunk_size or 64)
    spec = impl.spec
    case = Case.from_json(args.case) if args.case else None
    device = case.device if case is not None else args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"device {device!r} asked for, but torch sees no CUDA device")
    if args.examples < 1:
        raise UsageError(f"--examples must be >= 1, got {args.examples}")
    if args.name != "all" and (reason := not_applicable(args.name, impl)):
        raise UsageError(f"{args.name} does not apply: {reason}")
    results, rows = [], []
    for name in list(CHECKS) if args.name == "all" else [args.name]:
        if reason := not_applicable(name, impl):
            print(f"{name}: not applicable: {reason}")
            rows.append({"name": name, "status": "not applicable", "detail": reason})
        elif case is not None:
            results.append(ALL_CHECKS[name](impl, case))
        else:
            _progress(args.quiet, f"{name}: the regime's corners, then {args.examples} cases ...")
            found = find_failure(name, impl, args.device, args.examples, shrink=True)
            if found is None:
                detail = f"no failure in the regime's corners and {args.examples} searched cases"
                print(f"{name}: pass: {detail}")
                rows.append({"name": name, "status": "pass", "detail": detail})
            else:
                results.append(found)
    for result in results:
        print(result.report())
    rows += [r.to_dict() for r in results]
    _write_json(args.json, {"implementation": impl.name, "spec": str(spec), "checks": rows})
    # a by-nature result (relu's zero denominator) is the spec's, not the implementation's
    return 1 if any(not r.passed and not r.by_nature for r in results) else 0


def cmd_references(args: argparse.Namespace) -> int:
    from . import kat

    directory = Path(args.dir)
    say = None if args.quiet else (lambda text: _progress(False, text))
    if args.action == "build":
        start = time.perf_counter()
        manifest = kat.build(directory, progress=say)
        size = sum(e["bytes"] for e in manifest["vectors"])
        print(
            f"{len(manifest['vectors'])} vectors, {size / 2**20:.1f} MiB, under {directory} "
            f"in {time.perf_counter() - start:.1f} s"
        )
        _write_json(args.json, manifest)
        return 0
    if args.action == "check":
        if args.sample is not None and args.sample < 0:
            raise UsageError(f"--sample must be >= 0, got {args.sample}")
        problems = kat.check(directory, args.sample, progress=say)
        for problem in problems:
            print(f"FAIL {problem}")
        count = len(kat.load_manifest(directory)["vectors"])
        done = "all" if args.sample is None else f"up to {args.sample}"
        verdict = f"FAIL ({len(problems)} problem(s))" if problems else f"ok, {done} recomputed"
        print(f"{count} vectors: {verdict}")
        _write_json(args.json, {"vectors": count, "problems": problems})
        return 1 if problems else 0
    if not args.target or not args.feature_map:
        raise UsageError("references run needs TARGET and --feature-map")
    from .target import load_target

    rows = kat.run_vectors(load_target(args.target), args.feature_map, args.causal, directory)
    print("| vector | dtype | max error (u s) |\n|---|---|---:|")
    for row in rows:
        figure = row.get("problem") or f"{row['max_error_units']:.3g}"
        print(f"| {row['name']} | {row['dtype']} | {figure} |")
    for row in rows:  # JSON has no infinity
        if row["max_error_units"] == float("inf"):
            row["max_error_units"] = None
    _write_json(args.json, {"target": args.target, "vectors": rows})
    return 1 if any("problem" in row for row in rows) else 0


def cmd_random_features(args: argparse.Namespace) -> int:
    from .stats import CLAIMS, builtin_sampler, check_sampler
    from .target import load_target

    if args.sampler:
        if args.claim is None:
            raise UsageError("--sampler needs --claim iid or --claim orthogonal")
        runs = [(args.sampler, load_target(args.sampler), args.claim)]
    else:
        runs = [(f"lv.sample_projection_torch {c}", builtin_sampler(c), c) for c in CLAIMS]
    sizes = (("--d", args.d, 1), ("--m", args.m, 1), ("--replicates", args.replicates, 2))
    for name, value, least in sizes:
        if value < least:
            raise UsageError(f"{name} must be >= {least}, got {value}")
    if args.replicates < 1000:
        _progress(
            args.quiet,
            "note: below 1000 replicates the stated false-failure "
            "probabilities do not hold (normal approximation)",
        )
    payload: dict[str, Any] = {"samplers": []}
    failed = False
    for name, sampler, claim in runs:
        _progress(
            args.quiet,
            f"{name} (claims {claim}): {args.replicates} draws of ({args.m}, {args.d}) ...",
        )
        target = args.sampler if args.sampler else None
        results = check_sampler(sampler, claim, args.d, args.m, args.replicates, args.seed, target)
        print(f"{name}, claimed {claim}:")
        for r in results:
            print(f"  {'pass' if r.passed else 'FAIL'}  {r.check}: {r.message}")
            if not r.passed and r.repro:
                print(f"        reproduce: {r.repro}")
        failed |= not all(r.passed for r in results)
        payload["samplers"].append(
            {"sampler": name, "claim": claim, "checks": [r.to_dict() for r in results]}
        )
    if args.plots:
        from .stats.plot import plot_attention_error_vs_m, plot_mse_vs_m

        out = Path(args.plots)
        _progress(args.quiet, f"plots under {out} ...")
        payload["plots"] = {
            "mse_vs_m": plot_mse_vs_m(out / "mse_vs_m.png", seed=args.seed),
            "attention_error_vs_m": plot_attention_error_vs_m(
                out / "attention_error_vs_m.png", seed=args.seed
            ),
        }
        print(f"plots: {out / 'mse_vs_m.png'}, {out / 'attention_error_vs_m.png'}")
    print(f"verdict: {'FAIL' if failed else 'pass'}")
    payload["verdict"] = "fail" if failed else "pass"
    _write_json(args.json, payload)
    return 1 if failed else 0


def cmd_vet(args: argparse.Namespace) -> int:
    import torch

    from .adapters import ADAPTERS
    from .environment import environment
    from .vet import Target, VetOptions, vet

    if args.list:
        for adapter in ADAPTERS.values():
            print(f"{adapter.name:50} claims {adapter.spec} ({adapter.layout}, {adapter.device})")
        return 0
    if not args.target:
        raise UsageError("vet needs TARGET (module:function, path.py:function or an adapter)")
    adapter = ADAPTERS.get(args.target)
    if adapter is not None:
        if args.feature_map or args.causal or args.eps or args.layout:
            raise UsageError(f"{args.target} is an adapter: its spec and layout are its claim")
        if adapter.device == "cuda" and not args.device.startswith("cuda"):
            raise UsageError(f"{args.target} runs on CUDA only: give --device cuda")
        spec = None
    elif args.feature_map is None:
        raise UsageError("vet TARGET needs --feature-map NAME (the spec it claims)")
    else:
        spec = Spec(args.feature_map, causal=args.causal, eps=args.eps)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"device {args.device!r} asked for, but torch sees no CUDA device")
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout}")
    if args.sampler:
        from .target import load_target

        if not (adapter.spec if adapter else spec).info.needs_projection:
            raise UsageError("--sampler is for the Performer specs, which take a projection")
        if args.claim is None:
            raise UsageError("--sampler needs --claim iid or --claim orthogonal")
        load_target(args.sampler)  # a sampler that cannot be loaded is a usage error here
    options = VetOptions(
        dtypes=tuple(args.dtypes),
        device=args.device,
        sampler=args.sampler,
        claim=args.claim,
        kat=args.kat,
        grad=args.grad,
        thorough=args.thorough,
        seed=args.seed,
        timeout=args.timeout,
        cost=args.cost or (adapter.cost if adapter else None),
    )
    target = Target(args.target, spec, args.layout or "bhnd")
    report = vet(target, options, None if args.quiet else lambda t: _progress(False, t))
    print(report.summary())
    _write_json(
        args.json,
        {
            "verdict": report.verdict,
            "target": report.target,
            "implementation": report.implementation,
            "spec": report.spec,
            "checks": report.rows,
            "environment": environment(args.device),
        },
    )
    return 1 if report.failed else 0


def _load_report(path: str) -> dict[str, Any]:
    """An earlier report.json for --compare, or a UsageError that says what is wrong."""
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise UsageError(f"--compare {path}: cannot read a report: {err}") from None
    from .report import SCHEMA

    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise UsageError(f"--compare {path}: not a report.json of this tool ({SCHEMA!r})")
    return document


def _report_options(args: argparse.Namespace) -> Any:
    """ReportOptions from the arguments; UsageError for a bad combination."""
    import torch

    from .adapters import ADAPTERS
    from .report import ReportOptions

    claims = [f for f in ("feature_map", "causal", "eps", "layout") if getattr(args, f)]
    if args.impl is None:
        if claims or args.cost:
            name = (claims or ["cost"])[0].replace("_", "-")
            raise UsageError(f"--{name} describes --impl, which is not given")
    elif args.impl in ADAPTERS:
        if claims:
            raise UsageError(f"{args.impl} is an adapter: its spec and layout are its claim")
        if ADAPTERS[args.impl].device == "cuda" and args.device != "cuda":
            raise UsageError(f"{args.impl} runs on CUDA only: give --device cuda")
    elif args.feature_map is None:
        raise UsageError("--impl needs --feature-map NAME (the spec it claims)")
    if args.impl is not None and args.specs is not None:
        raise UsageError("--specs chooses built-in specs; --impl reports its own (--feature-map)")
    if args.device is None:
        devices = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
    elif args.device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"device {args.device!r} asked for, but torch sees no CUDA device")
    else:
        devices = (args.device,)
    return ReportOptions(
        specs=tuple(dict.fromkeys(args.specs or FEATURE_MAPS)),
        dtypes=tuple(dict.fromkeys(args.dtypes)),
        devices=devices,
        full=args.full,
        seed=args.seed,
        impl=args.impl,
        feature_map=args.feature_map,
        causal=args.causal,
        eps=args.eps,
        layout=args.layout or "bhnd",
        cost=args.cost,
        grad=not args.no_grad,
    )


def _probe(plan: Any, device: str) -> None:
    """One small float32 call of --impl on `device` before the run, at the sweep's head
    size (N = 16, d = dv = 16): a target that fails at all fails here, by name, and no
    report is written."""
    import torch

    from .checks.core import ImplementationFailure
    from .implementations import sample_projection_torch
    from .scaling import attention_inputs

    spec, impls = plan.groups[0]
    (impl,) = impls.values()
    w = None
    if spec.info.needs_projection:
        w = sample_projection_torch(16, 16, "orthogonal", torch.Generator().manual_seed(0))
        w = w.to(device)
    try:
        impl(*attention_inputs(16, d=16, dv=16, device=device), w)
    except ImplementationFailure as err:
        raise ReportTargetFailed(f"{impl.name} {err}; no report written") from None


class ReportTargetFailed(Exception):
    """--impl fails on a small float32 call: exit 1."""


def cmd_report(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .report import (
        compare,
        counts,
        make_plan,
        publish,
        render,
        run_report,
        staging,
        units,
        write_json_atomically,
    )

    options = _report_options(args)
    old = _load_report(args.compare) if args.compare else None
    if args.json:
        _check_writable(Path(args.json))
    plan = make_plan(options)
    if options.impl:
        try:
            _probe(plan, options.devices[0])
        except ReportTargetFailed as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    out = Path(args.out)
    # SIGTERM (a CI timeout, kill) unwinds like Ctrl-C: the staging folder is removed and
    # the previous report stays as it was
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    with staging(out) as folder:
        with tqdm(total=units(options, plan), disable=args.quiet, file=sys.stderr) as bar:

            def step(done: str) -> None:
                bar.set_postfix_str(done, refresh=False)
                bar.update()

            document = run_report(options, folder, step)
        document = json.loads(dumps(document))  # the form --compare reads back (str keys)
        comparison = compare(old, document, args.compare) if old is not None else None
        if comparison is not None:
            document["comparison"] = comparison.to_dict()
        (folder / "report.json").write_text(dumps(document))
        (folder / "report.md").write_text(render(document, comparison and comparison.markdown()))
        publish(folder, out)
    if args.json:
        write_json_atomically(Path(args.json), document)
    print(
        f"report: {out / 'report.md'} (+ report.json, plots); verdict {document['verdict']}: "
        f"{counts(document)}; {document['environment']['seconds']:.0f} s"
    )
    regressed = bool(comparison and comparison.regressions)
    if comparison is not None:
        print("\n".join(comparison.markdown()[2:]))
    return 1 if document["verdict"] != "pass" or regressed else 0


def _check_writable(path: Path) -> None:
    """A --json path whose folder cannot take a file fails now, not after the run."""
    folder = path.parent
    if path.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK):
        raise UsageError(f"--json {path}: cannot write a file there")


def _add_output_options(parser: argparse.ArgumentParser) -> None:
    """--json and --quiet, which every command has."""
    parser.add_argument("--json", help="write the results as JSON here")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m linattn_verify",
        description="Numerical verification of linear attention against exact references.",
        epilog="Examples:\n"
        "  python -m linattn_verify report\n"
        "  python -m linattn_verify accuracy\n"
        "  python -m linattn_verify reference --random 1,1,4096,64,64 --feature-map elu --causal\n"
        "  python -m linattn_verify scaling --feature-map elu --causal --time\n"
        "  python -m linattn_verify vet mykernels.py:attn --feature-map elu --causal\n"
        "  python -m linattn_verify random-features --sampler mysampler.py:draw --claim iid\n"
        "Run `python -m linattn_verify COMMAND --help` for each command.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    ref = sub.add_parser(
        "reference",
        help="exact attention output for given or random inputs (.npz)",
        description="Compute the exact reference output (float64, within one ulp).",
        epilog="Examples:\n"
        "  python -m linattn_verify reference inputs.npz --feature-map softmax --out ref.npz\n"
        "  python -m linattn_verify reference --random 1,1,4096,64,64 --feature-map elu --causal\n"
        "inputs.npz holds arrays q, k (B,H,N,d), v (B,H,N,dv) and, for Performer maps,\n"
        "projection (m,d); any float dtype, taken exactly.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = ref.add_mutually_exclusive_group(required=True)
    source.add_argument("input", nargs="?", help=".npz file with q, k, v [, projection]")
    source.add_argument("--random", type=_shape, metavar="B,H,N,d,dv", help="random N(0,1) inputs")
    ref.add_argument("--feature-map", required=True, choices=list(FEATURE_MAPS))
    ref.add_argument("--causal", action="store_true")
    ref.add_argument("--eps", type=float, default=0.0, help="denominator eps (default 0)")
    ref.add_argument("--engine", choices=["auto", "mp", "arb"], default="auto")
    ref.add_argument("--seed", type=int, default=0, help="seed of --random (default 0)")
    ref.add_argument("--out", help="write the output to this .npz (array 'out')")
    _add_output_options(ref)
    ref.set_defaults(func=cmd_reference)

    acc = sub.add_parser(
        "accuracy",
        help="judge the golden implementation against the exact reference",
        description="Run the golden torch implementation of each spec, causal and not, in each "
        "dtype on seeded random inputs, and judge it with the accuracy model: error in units "
        "of roundoff, the a-priori bound, pass/fail. Exit 1 if any case fails.",
        epilog="Examples:\n"
        "  python -m linattn_verify accuracy\n"
        "  python -m linattn_verify accuracy --specs elu softmax --dtypes float16 \\\n"
        "      --shape 1,2,256,32,32\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    acc.add_argument("--specs", nargs="+", default=list(FEATURE_MAPS), metavar="NAME")
    acc.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES, metavar="DTYPE")
    acc.add_argument("--shape", type=_shape, default=(1, 2, 64, 16, 16), metavar="B,H,N,d,dv")
    acc.add_argument("--seed", type=int, default=0)
    _add_output_options(acc)
    acc.set_defaults(func=cmd_accuracy)

    sca = sub.add_parser(
        "scaling",
        help="does an implementation's cost grow linearly in N?",
        description="Count FLOPs and peak live bytes over N = 256 ... --max-n (exact), fit "
        "log-log slopes over the larger half and check them against --expect; with --time, "
        "also time it (one thread, noise gate) against torch's SDPA and plot. Exit 1 when "
        "the counted growth is not what is expected.",
        epilog="Examples:\n"
        "  python -m linattn_verify scaling --feature-map elu --causal --time\n"
        "  python -m linattn_verify scaling mykernels.py:linear_attn --feature-map elu\n"
        "TARGET follows the contract fn(q, k, v[, projection=W]) -> out, (B, H, N, d).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sca.add_argument(
        "target",
        nargs="?",
        help="module:function or path.py:function (default: the built-in implementation)",
    )
    sca.add_argument("--feature-map", default="elu", choices=list(FEATURE_MAPS))
    sca.add_argument("--causal", action="store_true")
    sca.add_argument("--expect", choices=["linear", "quadratic"], default="linear")
    sca.add_argument("--max-n", type=int, default=2**16, help="largest N (default 65536)")
    sca.add_argument("--d", type=int, default=64, help="head dimension d = dv (default 64)")
    sca.add_argument("--time", action="store_true", help="also time it and plot")
    sca.add_argument("--repeats", type=int, default=5)
    sca.add_argument("--seed", type=int, default=0)
    sca.add_argument("--out", default="reports/scaling", help="folder of the plot")
    _add_output_options(sca)
    sca.set_defaults(func=cmd_scaling)

    chk = sub.add_parser(
        "check",
        help="run one property check (or all) on one case, or search for a failure",
        description="Run a check of linattn_verify.checks on an implementation: on one case "
        "(--case, the JSON a failing property test prints), or over --examples cases drawn "
        "by the property suite's strategies, shrinking the first failure. Exit 1 on a "
        "failure.",
        epilog="Examples:\n"
        "  python -m linattn_verify check causality --form chunked --feature-map elu --causal\n"
        "  python -m linattn_verify check all --impl mykernels.py:attn --feature-map elu\n"
        "  python -m linattn_verify check reference --form linear --feature-map elu \\\n"
        '      --case \'{"b":1,"h":2,"n":7,"d":4,"dv":3,"dtype":"float16"}\'\n'
        "Checks: "
        + ", ".join(CHECK_NAMES)
        + "; of the backward: "
        + ", ".join(GRAD_CHECK_NAMES)
        + ".",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    chk.add_argument(
        "name",
        choices=[*CHECK_NAMES, *GRAD_CHECK_NAMES, "all"],
        metavar="NAME",
        help="a check, or all (the forward checks)",
    )
    which = chk.add_mutually_exclusive_group()
    which.add_argument("--impl", help="module:function or path.py:function under test")
    which.add_argument(
        "--form", default="quadratic", help="built-in form (default quadratic) when no --impl"
    )
    chk.add_argument("--chunk-size", type=int, help="built-in chunked form's chunk (default 64)")
    chk.add_argument("--feature-map", choices=list(FEATURE_MAPS), help="needed but for adapters")
    chk.add_argument("--causal", action="store_true")
    chk.add_argument("--eps", type=float, default=0.0, help="denominator eps (default 0)")
    chk.add_argument("--layout", choices=["bhnd", "bnhd"], help="--impl's layout (default bhnd)")
    chk.add_argument("--case", help="the case as JSON (printed by a failing property test)")
    chk.add_argument("--examples", type=int, default=50, help="cases to search (default 50)")
    chk.add_argument("--device", default="cpu", help="device of the searched cases")
    _add_output_options(chk)
    chk.set_defaults(func=cmd_check)
    kat_parser = sub.add_parser(
        "references",
        help="known-answer vectors: build, check, or run an implementation on them",
        description="Known-answer vectors under references/ (see references/README.md): "
        "build regenerates them (the same bytes every time), check verifies every sha256 "
        "and recomputes a sample with the arb engine (exit 1 naming a bad file), run "
        "reports an implementation's error per vector in units of u s of its dtype.",
        epilog="Examples:\n"
        "  python -m linattn_verify references check\n"
        "  python -m linattn_verify references build\n"
        "  python -m linattn_verify references run mykernels.py:attn --feature-map elu --causal\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    kat_parser.add_argument("action", choices=["build", "check", "run"])
    kat_parser.add_argument("target", nargs="?", help="run: module:function or path.py:function")
    kat_parser.add_argument("--feature-map", choices=list(FEATURE_MAPS), help="run: its spec")
    kat_parser.add_argument("--causal", action="store_true", help="run: a causal spec")
    kat_parser.add_argument("--dir", default="references", help="the vectors' folder")
    kat_parser.add_argument(
        "--sample", type=int, help="check: recompute this many vectors (default: all)"
    )
    _add_output_options(kat_parser)
    kat_parser.set_defaults(func=cmd_references)
    rf = sub.add_parser(
        "random-features",
        help="statistics of a projection sampler: unbiasedness, MSE, orthogonal features",
        description="Check a sampler of Performer projections W (m, d): the kernel estimators "
        "of performer-positive, -hyperbolic and -trig are unbiased, and their MSE matches "
        "Lemma 2 of Choromanski et al. 2021 (claim iid) or the exact MSE of orthogonal rows "
        "with chi(d) norms, below the iid one (claim orthogonal). Each assertion fails a "
        "correct sampler with probability 1e-10. Without --sampler, the project's own. "
        "The sampler is sampler(m, d, generator) -> W, drawing from the torch.Generator.",
        epilog="Examples:\n"
        "  python -m linattn_verify random-features\n"
        "  python -m linattn_verify random-features --sampler mysampler.py:draw --claim iid\n"
        "  python -m linattn_verify random-features --plots reports/random_features\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rf.add_argument("--sampler", help="module:function or path.py:function under test")
    rf.add_argument("--claim", choices=["iid", "orthogonal"], help="what --sampler's rows are")
    rf.add_argument("--d", type=int, default=16, help="dimension of the rows (default 16)")
    rf.add_argument("--m", type=int, default=64, help="rows per draw (default 64)")
    rf.add_argument("--replicates", type=int, default=4096, help="draws (default 4096)")
    rf.add_argument("--seed", type=int, default=0)
    rf.add_argument(
        "--plots", help="also write plots of the project's samplers here (MSE and error vs m)"
    )
    _add_output_options(rf)
    rf.set_defaults(func=cmd_random_features)
    vt = sub.add_parser(
        "vet",
        help="one verdict on a third-party implementation: every check, figures, exit code",
        description="Run every applicable check on TARGET in a worker process (an exception, "
        "a crash or a hang is a failed check): the property checks over the regime's corners "
        "and a Hypothesis search (N = 1, ragged N, B, H >= 2, d != dv, d = m, non-contiguous "
        "inputs, adversarial magnitudes), accuracy against the exact reference per dtype, "
        "cost scaling, and on request the known-answer vectors and a projection sampler's "
        "statistics. TARGET is module:function, path.py:function, or an adapter of a "
        "third-party library (--list). Exit 0 when every check passes, 1 when one fails, "
        "2 for usage errors or a TARGET that cannot be loaded.",
        epilog="Examples:\n"
        "  python -m linattn_verify vet mykernels.py:attn --feature-map elu --causal\n"
        "  python -m linattn_verify vet mypkg.ops:favor --feature-map performer-positive \\\n"
        "      --sampler mypkg.ops:draw_w --claim orthogonal --json vet.json\n"
        "  python -m linattn_verify vet --list\n"
        "  python -m linattn_verify vet fast-transformers.linear --kat\n"
        "  python -m linattn_verify vet mykernels.py:attn --feature-map elu --causal --grad\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    vt.add_argument("target", nargs="?", help="module:function, path.py:function or adapter")
    vt.add_argument("--list", action="store_true", help="list the third-party adapters")
    vt.add_argument("--feature-map", choices=list(FEATURE_MAPS), help="the spec TARGET claims")
    vt.add_argument("--causal", action="store_true")
    vt.add_argument("--eps", type=float, default=0.0, help="denominator eps (default 0)")
    vt.add_argument("--layout", choices=["bhnd", "bnhd"], help="TARGET's layout (default bhnd)")
    vt.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES))
    vt.add_argument("--device", default="cpu")
    vt.add_argument("--sampler", help="module:function drawing W (m, d) from a torch.Generator")
    vt.add_argument("--claim", choices=["iid", "orthogonal"], help="what --sampler's rows are")
    vt.add_argument("--kat", action="store_true", help="also run the known-answer vectors")
    vt.add_argument(
        "--grad",
        action="store_true",
        help="also the gradient checks of its backward (" + ", ".join(GRAD_CHECK_NAMES) + ")",
    )
    vt.add_argument(
        "--cost",
        choices=["linear", "quadratic"],
        help="the growth TARGET claims (default: quadratic for softmax, else linear)",
    )
    vt.add_argument("--thorough", action="store_true", help="200 searched cases a check, not 25")
    vt.add_argument("--seed", type=int, default=0, help="seed of the random-feature draws")
    vt.add_argument("--timeout", type=float, default=300.0, help="seconds a task (default 300)")
    _add_output_options(vt)
    vt.set_defaults(func=cmd_vet)
    rp = sub.add_parser(
        "report",
        help="the error and scaling report: Markdown, JSON and plots",
        description="Judge every form of every spec in every dtype against the exact "
        "reference (errors in units of roundoff, bound, budget), with accuracy vs N and the "
        "denominators' margins; the project's random-feature samplers (unbiasedness, MSE vs "
        "theory); counted cost growth and timings against SDPA. Writes report.md, "
        "report.json and PNG plots to --out, atomically (a failed run leaves the previous "
        "report as it was). The default run takes about 3 minutes on 2 CPU cores; --full "
        "sweeps wider. Exit 0 when everything passes, 1 on a failed judgement or a "
        "regression against --compare, 2 on usage errors.",
        epilog="Examples:\n"
        "  python -m linattn_verify report\n"
        "  python -m linattn_verify report --specs elu performer-positive --dtypes float16\n"
        "  python -m linattn_verify report --compare reports/baseline/report.json\n"
        "  python -m linattn_verify report --impl mykernels.py:attn --feature-map elu \\\n"
        "      --causal --out reports/mykernel\n"
        "  python -m linattn_verify report --impl fla.based-naive --out reports/fla-based\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rp.add_argument("--full", action="store_true", help="the wide sweep (N to 1024, all timed)")
    rp.add_argument("--specs", nargs="+", choices=list(FEATURE_MAPS), metavar="NAME",
                    help="built-in specs to report (default: all)")  # fmt: skip
    rp.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES), metavar="DTYPE")
    rp.add_argument("--device", help="cpu or cuda (default: cpu, and cuda when present)")
    rp.add_argument(
        "--impl", help="module:function, path.py:function or adapter (vet --list) to report on"
    )
    rp.add_argument("--feature-map", choices=list(FEATURE_MAPS), help="the spec --impl claims")
    rp.add_argument("--causal", action="store_true", help="--impl is causal")
    rp.add_argument("--eps", type=float, default=0.0, help="--impl's denominator eps")
    rp.add_argument("--layout", choices=["bhnd", "bnhd"], help="--impl's layout (default bhnd)")
    rp.add_argument("--cost", choices=["linear", "quadratic"], help="the growth --impl claims")
    rp.add_argument("--out", default="reports/latest", help="folder (default reports/latest)")
    rp.add_argument("--compare", metavar="OLD.json", help="report regressions against it")
    rp.add_argument(
        "--no-grad", action="store_true", help="skip the gradients (a forward-only --impl)"
    )
    rp.add_argument("--seed", type=int, default=0, help="seed of every input (default 0)")
    _add_output_options(rp)
    rp.set_defaults(func=cmd_report)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (UsageError, SpecError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
