"""The checks that need a GPU, as one prepared run (`make device-check`).

    python benchmarks/device_check.py [--out reports/device] [--device cuda|cpu]

On a machine with CUDA (--device cuda, the default) it runs, each as its own process with a
time limit, writing every log under --out:

1. the CUDA-parametrised tests (`pytest -m "not scaling" -k cuda`: the property suite over
   every built-in form on CUDA, the golden implementation's CUDA tests);
2. `report --device cuda` in float16, bfloat16 and float32, once with TF32 off and once on
   (torch.backends.cuda.matmul.allow_tf32 and cudnn.allow_tf32; the report's environment
   block records the flags);
3. `vet --smallest` of every Triton adapter (fla's kernels) natively, with its known-answer
   vectors, once with TF32 off (TRITON_F32_DEFAULT=ieee: float32 tl.dot in IEEE) and once
   on (Triton's default on Ampere and newer).

summary.md and summary.json list each step: its command, exit code, seconds and log, and
the Triton adapters' verdicts side by side: in Triton's interpreter (expected.txt, the CPU's
default plan), natively with TF32 off and on. On a
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


TF32_OFF = {"TRITON_F32_DEFAULT": "ieee"}  # Triton's switch of tl.dot's float32 default


def steps(device: str, out: Path) -> list[tuple[str, list[str], dict[str, str]]]:
    """(name, argv, environment) of each step for `device` ("cuda", or "cpu" for the dry
    run)."""
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
    plan = [("tests", [python, *tests, "-p", "no:cacheprovider"], {})]
    for on in (False, True):
        name = f"report-tf32-{'on' if on else 'off'}"
        code = TF32_PRELUDE.format(on=on)
        argv = ["report", "--device", device, *report_args, "--out", str(out / name), "--quiet"]
        plan.append((name, [python, "-c", code, *argv], {}))
    for name in vetted(device):
        target = (
            ["--form", "chunked", "--feature-map", "relu", "--causal"] if name == "-" else [name]
        )
        # the dry run tests the plumbing: no long context, one dtype
        dry = [] if device == "cuda" else ["--long", "0", "--dtypes", "float32", "--no-envelope"]
        for tf32, env in (("off", TF32_OFF), ("on", {})):
            json_path = out / f"vet-{name if name != '-' else 'builtin'}-tf32-{tf32}.json"
            argv = ["-m", "linattn_verify", "vet", *target, "--device", device, "--kat",
                    "--smallest", *dry, "--quiet", "--json", str(json_path)]  # fmt: skip
            step = f"vet {name if name != '-' else 'built-in chunked relu'} tf32 {tf32}"
            plan.append((step, [python, *argv], env))
    return plan


def side_by_side(out: Path, device: str) -> list[str]:
    """The Triton adapters' verdicts as a table: in the interpreter (expected.txt), natively
    with TF32 off and on (the vet JSONs of this run)."""
    from linattn_verify.adapters.expected import load_expected

    expected = load_expected()
    lines = ["| adapter | interpreter (expected.txt, default plan) | native, TF32 off (--smallest) "
             "| native, TF32 on (--smallest) |",
             "|---|---|---|---|"]  # fmt: skip
    for name in vetted(device):
        file = name if name != "-" else "builtin"
        entry = expected.get(name)
        interpreted = "-" if name == "-" else _verdict(entry.failing if entry else set())
        native = []
        for tf32 in ("off", "on"):
            path = out / f"vet-{file}-tf32-{tf32}.json"
            found = json.loads(path.read_text()) if path.is_file() else None
            failing = found and {r["name"] for r in found["checks"] if r["status"] == "fail"}
            native.append("not run" if found is None else _verdict(failing or set()))
        lines.append(f"| {name} | {interpreted} | {native[0]} | {native[1]} |")
    return lines


def _verdict(failing: set[str]) -> str:
    return f"fail: {', '.join(sorted(failing))}" if failing else "pass"


def vetted(device: str) -> list[str]:
    """The CUDA adapters; for the dry run "-", a built-in form in their place."""
    if device != "cuda":
        return ["-"]
    from linattn_verify.adapters import ADAPTERS

    return [name for name, adapter in ADAPTERS.items() if adapter.triton]


def run(name: str, argv: list[str], env: dict[str, str], log: Path) -> dict:
    """One step, its output to `log`; its figures for the summary."""
    start = time.perf_counter()
    with log.open("w") as sink:
        try:
            code = subprocess.run(argv, stdout=sink, stderr=subprocess.STDOUT, timeout=STEP_LIMIT,
                                  env={**os.environ, "CI": "true", **env}).returncode  # fmt: skip
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
    for index, (name, argv, env) in enumerate(steps(args.device, out)):
        log = out / f"{index:02d}-{name.replace(' ', '-')}.log"
        results.append(run(name, argv, env, log))
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
    lines += ["", "## Triton kernels: verdicts side by side", "", *side_by_side(out, args.device)]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print(f"device-check: {out / 'summary.md'}")
    return 0 if all(r["exit"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
