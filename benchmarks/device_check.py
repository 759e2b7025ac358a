"""The checks that need a GPU, as one prepared run (`make device-check`).

    python benchmarks/device_check.py [--out reports/device] [--device cuda|cpu]

On a machine with CUDA (--device cuda, the default) it runs, each as its own process with a
time limit, writing every log under --out:

1. the CUDA-parametrised tests (`pytest -m "not scaling" -k cuda`: the property suite over
   every built-in form on CUDA, the golden implementation's CUDA tests);
2. `report --device cuda` in float16, bfloat16 and float32, once with TF32 off and once on
   (torch.backends.cuda.matmul.allow_tf32 and cudnn.allow_tf32; the report's environment
   block records the flags);
3. `vet` of every CUDA adapter (fla's Triton kernels) with its known-answer vectors.

summary.md and summary.json list each step: its command, exit code, seconds and log. On a
machine without CUDA it says so in one line and exits 0. `--device cpu` is the dry run of
the same plumbing on the CPU, small: a slice of the property suite, a one-spec report with
the TF32 flags set either way, and vet of a built-in form in place of the CUDA adapters.
Exit 0 when every step passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

STEP_LIMIT = 600  # seconds a step may take: a hang must not eat the GPU lease
TF32_PRELUDE = (
    "import sys, torch; torch.backends.cuda.matmul.allow_tf32 = {on}; "
    "torch.backends.cudnn.allow_tf32 = {on}; from linattn_verify.cli import main; "
    "sys.exit(main(sys.argv[1:]))"
)


def steps(device: str, out: Path) -> list[tuple[str, list[str]]]:
    """(name, argv) of each step for `device` ("cuda", or "cpu" for the dry run)."""
    python = sys.executable
    if device == "cuda":
        tests = ["-m", "pytest", "-q", "-n", "8", "-m", "not scaling", "-k", "cuda", "tests",
                 "properties"]  # fmt: skip
        report_args = ["--dtypes", "float16", "bfloat16", "float32"]
    else:
        tests = ["-m", "pytest", "-q", "properties/test_agreement.py::test_reference_agreement",
                 "-k", "elu-causal-chunked-cpu"]  # fmt: skip
        report_args = ["--form", "chunked", "--feature-map", "elu", "--causal", "--dtypes",
                       "float32", "--no-grad"]  # fmt: skip
    plan = [("tests", [python, *tests, "-p", "no:cacheprovider"])]
    for on in (False, True):
        name = f"report-tf32-{'on' if on else 'off'}"
        code = TF32_PRELUDE.format(on=on)
        argv = ["report", "--device", device, *report_args, "--out", str(out / name), "--quiet"]
        plan.append((name, [python, "-c", code, *argv]))
    for name in vetted(device):
        target = (
            ["--form", "chunked", "--feature-map", "relu", "--causal"] if name == "-" else [name]
        )
        json_path = out / f"vet-{name if name != '-' else 'builtin'}.json"
        # the dry run tests the plumbing: no long context, one dtype
        dry = [] if device == "cuda" else ["--long", "0", "--dtypes", "float32", "--no-envelope"]
        argv = ["-m", "linattn_verify", "vet", *target, "--device", device, "--kat", *dry,
                "--quiet", "--json", str(json_path)]  # fmt: skip
        plan.append((f"vet {name if name != '-' else 'built-in chunked relu'}", [python, *argv]))
    return plan


def vetted(device: str) -> list[str]:
    """The CUDA adapters; for the dry run "-", a built-in form in their place."""
    if device != "cuda":
        return ["-"]
    from linattn_verify.adapters import ADAPTERS

    return [name for name, adapter in ADAPTERS.items() if adapter.triton]


def run(name: str, argv: list[str], log: Path) -> dict:
    """One step, its output to `log`; its figures for the summary."""
    start = time.perf_counter()
    with log.open("w") as sink:
        try:
            code = subprocess.run(argv, stdout=sink, stderr=subprocess.STDOUT, timeout=STEP_LIMIT,
                                  env={**os.environ, "CI": "true"}).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            code = "timeout"
    seconds = time.perf_counter() - start
    print(f"{name}: exit {code} in {seconds:.0f} s ({log.name})", flush=True)
    return {"step": name, "command": argv, "exit": code, "seconds": seconds, "log": log.name}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="reports/device", help="folder of every output")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "device-check: torch sees no CUDA device here; nothing to run (--device cpu: dry run)"
        )
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for index, (name, argv) in enumerate(steps(args.device, out)):
        log = out / f"{index:02d}-{name.replace(' ', '-')}.log"
        results.append(run(name, argv, log))
    summary = {
        "device": args.device,
        "name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "steps": results,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    lines = [f"# device check ({summary['name']}, torch {summary['torch']})", "",
             "| step | exit | seconds | log |", "|---|---|---:|---|"]  # fmt: skip
    lines += [f"| {r['step']} | {r['exit']} | {r['seconds']:.0f} | {r['log']} |" for r in results]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print(f"device-check: {out / 'summary.md'}")
    return 0 if all(r["exit"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
