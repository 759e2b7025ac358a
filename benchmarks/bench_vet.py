"""Time and memory to a verdict: vet's default plan (long context and envelope included) on
small O(N) kernels in plain torch, with and without --grad, simple GLA's gates and GLA's
channel gates (the zoo's chunked kernel and the built-in forms, --state --grad), the delta
rule's built-in forms (KDA, Gated DeltaNet), assert_linear_attention with its
defaults, and a kernel that materialises N x N weights under a claim of linear cost.

    python benchmarks/bench_vet.py [--only NAME ...] [--json PATH]

Run from the repository root (the kernels are tests/zoo's), with nothing else running: each
run is a fresh process, timed by the wall clock around it; its peak resident memory is the
largest of the process tree's (wait4's ru_maxrss: vet's parent or its worker, whichever is
larger), and vet's --json gives the worker's and the parent's apart and the seconds of each
step of the plan. The budgets (DESIGN.md, "Budgets that users feel"): 60 s (90 s with
--grad) and 4 GiB. The output is a Markdown table for docs/performance.md ("vet").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VET = [sys.executable, "-m", "linattn_verify", "vet"]
ELU_CAUSAL = ["--feature-map", "elu", "--causal"]
GLA = ["--feature-map", "identity", "--causal", "--no-normalize", "--decay", "channel-gates"]
DELTA = ["--feature-map", "identity", "--causal", "--no-normalize", "--scale", "d^-0.5",
         "--delta-rule"]  # fmt: skip
TRIG_GATED = ["--feature-map", "performer-trig", "--causal", "--decay", "gates", "--scale",
              "d^-0.5", "--form", "chunked"]  # fmt: skip
ASSERT = (
    "from linattn_verify.testing import assert_linear_attention\n"
    "from tests.zoo.textbook import elu_cumsum\n"
    "assert_linear_attention(elu_cumsum, 'elu', causal=True)\n"
)
# (name, command, seconds allowed, exit status expected)
RUNS = (
    ("elu-cumsum", [*VET, "tests.zoo.textbook:elu_cumsum", *ELU_CAUSAL], 60, 0),
    ("elu-cumsum --grad", [*VET, "tests.zoo.textbook:elu_cumsum", *ELU_CAUSAL, "--grad"], 90, 0),
    ("elu-chunked", [*VET, "tests.zoo.textbook:elu_chunked", *ELU_CAUSAL], 60, 0),
    ("elu-chunked --grad", [*VET, "tests.zoo.textbook:elu_chunked", *ELU_CAUSAL, "--grad"], 90, 0),
    ("favor", [*VET, "tests.zoo.textbook:favor_global_max", "--feature-map",
               "performer-positive"], 60, 0),
    ("favor --grad", [*VET, "tests.zoo.textbook:favor_global_max", "--feature-map",
                      "performer-positive", "--grad"], 90, 0),
    ("gla-chunked --state S --grad", [*VET, "tests.zoo.gla:gla_chunked", *GLA, "--state", "S",
                                     "--grad"], 90, 0),
    ("built-in chunked simple GLA", [*VET, "--feature-map", "identity", "--causal",
                                     "--no-normalize", "--scale", "d^-0.5", "--decay", "gates",
                                     "--form", "chunked"], 60, 0),
    ("built-in chunked GLA --state --grad", [*VET, *GLA, "--scale", "d^-0.5", "--form",
                                             "chunked", "--state", "--grad"], 90, 0),
    ("built-in chunked KDA --state --grad", [*VET, *DELTA, "--decay", "channel-gates",
                                             "--form", "chunked", "--state", "--grad"], 90, 0),
    ("built-in chunked Gated DeltaNet --qk-l2norm --varlen --value-heads 2",
     [*VET, *DELTA, "--decay", "gates", "--qk-l2norm", "--form", "chunked", "--varlen",
      "--value-heads", "2"], 60, 0),
    ("built-in chunked taylor --grad", [*VET, "--feature-map", "taylor", "--causal", "--form",
                                        "chunked", "--grad"], 90, 0),
    ("built-in chunked performer-trig --grad", [*VET, "--feature-map", "performer-trig",
                                                "--causal", "--form", "chunked", "--grad"], 90, 0),
    ("built-in chunked performer-trig gates d^-0.5", [*VET, *TRIG_GATED], 60, 0),
    ("built-in chunked performer-trig gates d^-0.5 --grad", [*VET, *TRIG_GATED, "--grad"], 90, 0),
    ("built-in chunked identity gates (normalised)", [*VET, "--feature-map", "identity",
                                                      "--causal", "--decay", "gates", "--form",
                                                      "chunked"], 60, 0),
    ("built-in quadratic softmax --grad", [*VET, "--feature-map", "softmax", "--causal",
                                           "--form", "quadratic", "--grad"], 90, 0),
    ("assert_linear_attention elu-cumsum", [sys.executable, "-c", ASSERT], 60, 0),
    ("N x N claiming linear", [*VET, "tests.zoo.long:quadratic_weights", *ELU_CAUSAL], 60, 1),
)  # fmt: skip
BUDGET_BYTES = 4 * 2**30


def run(name: str, command: list[str], folder: Path) -> dict:
    """One fresh process: wall seconds, peak resident bytes of its tree, exit status, and
    vet's JSON (steps' seconds, worker's and parent's peaks) where it writes one."""
    json_path = folder / f"{len(list(folder.iterdir()))}.json"
    is_vet = command[:4] == VET
    argv = [*command, "--json", str(json_path)] if is_vet else command
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    errors = folder / f"{json_path.stem}.err"  # a file, not a pipe: a full pipe would block
    start = time.perf_counter()
    with errors.open("w") as err:
        process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    stderr = errors.read_text()
    row = {
        "name": name,
        "seconds": seconds,
        "max_rss": usage.ru_maxrss * 1024,
        "exit": os.waitstatus_to_exitcode(status),
    }
    if is_vet and json_path.exists():
        report = json.loads(json_path.read_text())
        row |= {"steps": report["seconds"], "processes": report["max_rss"]}
        row["verdict"] = report["verdict"]
        row["findings"] = [f["detail"] for f in report["findings"] if f["regime"] == "typical"]
    elif row["exit"] not in (0, 1):
        row["error"] = stderr.strip().splitlines()[-1:] or ["(no message)"]
    return row


def within(row: dict, seconds: float, status: int | None) -> bool:
    """Whether a run kept its time and memory budgets and exited as expected (status None:
    a verdict either way, 0 or 1)."""
    exited = row["exit"] in (0, 1) if status is None else row["exit"] == status
    return row["seconds"] <= seconds and row["max_rss"] <= BUDGET_BYTES and exited


def table(rows: list[dict], allowed: dict[str, tuple[int, int | None]]) -> str:
    lines = [
        "| run | wall s | budget s | peak RSS GiB | exit | slowest steps (s) |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        seconds, status = allowed[r["name"]]
        steps = sorted(r.get("steps", {}).items(), key=lambda kv: -kv[1])[:3]
        slowest = ", ".join(f"{k} {v:.1f}" for k, v in steps) or "-"
        ok = within(r, seconds, status)
        mark = "" if ok else " **over**"
        lines.append(
            f"| {r['name']} | {r['seconds']:.1f}{mark} | {seconds} | "
            f"{r['max_rss'] / 2**30:.2f} | {r['exit']} | {slowest} |"
        )
    return "\n".join(lines)


def main(runs: tuple = RUNS, doc: str = __doc__) -> int:
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="runs whose name starts so")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    chosen = [r for r in runs if not args.only or any(r[0].startswith(o) for o in args.only)]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, command, _, _ in chosen:
            print(f"{name} ...", file=sys.stderr, flush=True)
            rows.append(run(name, command, Path(folder)))
            print(f"  {rows[-1]['seconds']:.1f} s", file=sys.stderr, flush=True)
    allowed = {name: (seconds, status) for name, _, seconds, status in runs}
    print(table(rows, allowed))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(within(r, *allowed[r["name"]]) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
