"""benchmarks/device_check.py (`make device-check`): one line and exit 0 without CUDA, the
plan it runs with CUDA, and its CPU dry run end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "device_check.py"
sys.path.insert(0, str(SCRIPT.parent))
import device_check  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_it_says_so_in_one_line(tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert run.returncode == 0 and len(run.stdout.splitlines()) == 1, run.stdout + run.stderr
    assert "no CUDA device" in run.stdout and not (tmp_path / "out").exists()


def test_the_cuda_plan_covers_tests_both_tf32_settings_and_every_cuda_adapter(tmp_path):
    from linattn_verify.adapters import ADAPTERS

    plan = {name: argv for name, argv, _ in device_check.steps("cuda", tmp_path)}
    assert "-k" in plan["tests"] and "cuda" in plan["tests"]
    for on in ("on", "off"):
        argv = plan[f"report-tf32-{on}"]
        assert f"allow_tf32 = {on == 'on'}" in argv[2] and "--device" in argv
    triton = [name for name, adapter in ADAPTERS.items() if adapter.triton]
    envs = {name: env for name, _, env in device_check.steps("cuda", tmp_path)}
    for name in triton:  # natively, TF32 off (IEEE float32 tl.dot) and on
        assert "--smallest" in plan[f"vet {name} tf32 on"] and not envs[f"vet {name} tf32 on"]
        assert envs[f"vet {name} tf32 off"] == {"TRITON_F32_DEFAULT": "ieee"}


def test_the_cpu_dry_run_writes_its_folder(tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--out", str(tmp_path)],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [s["exit"] for s in summary["steps"]] == [0, 0, 0, 0, 0]
    for on in (False, True):
        report = json.loads(
            (tmp_path / f"report-tf32-{'on' if on else 'off'}" / "report.json").read_text()
        )
        assert report["environment"]["cuda_matmul_allow_tf32"] is on
    text = (tmp_path / "summary.md").read_text()
    assert text.startswith("# device check") and "| - | - | pass | pass |" in text, text
