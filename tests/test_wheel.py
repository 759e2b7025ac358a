"""The built wheel, installed into a fresh venv, works from any folder: the known-answer
vectors are the package data of linattn_verify.known_answers (its DEFAULT_DIR), so
`known-answers check` and `vet --kat` find them outside the repository.
The venv borrows the heavy dependencies (torch, mpmath, flint) from this environment by a
path file; linattn_verify itself comes only from the wheel."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the vectors the repository holds (its manifest lists each once: test_known_answers checks it)
MANIFEST = ROOT / "linattn_verify" / "known_answers" / "manifest.json"
VECTORS = len(json.loads(MANIFEST.read_text())["vectors"])
NOT_BUILT = ("build", "dist", ".venv", ".git", "reports", "*.egg-info", "__pycache__", ".*cache")
KERNEL = """
import torch.nn.functional as F

def attn(q, k, v):
    q, k = F.elu(q) + 1, F.elu(k) + 1
    return (q @ (k.transpose(-2, -1) @ v)) / (q @ k.sum(-2, keepdim=True).transpose(-2, -1))
"""


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of the sources."""
    pytest.importorskip("setuptools", reason="builds the wheel without isolation")
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*NOT_BUILT))
    pip = [sys.executable, "-m", "pip", "-q"]
    built = _run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp), "."], source)
    assert built.returncode == 0, built.stderr
    (built_wheel,) = tmp.glob("linattn_verify-*.whl")
    return built_wheel


def test_the_wheel_holds_every_package(wheel: Path) -> None:
    """Every folder of linattn_verify/ with an __init__.py is in the wheel (pyproject finds
    them: a new family's folder needs no line there)."""
    held = set(zipfile.ZipFile(wheel).namelist())
    folders = {
        p.relative_to(ROOT).as_posix() for p in (ROOT / "linattn_verify").rglob("__init__.py")
    }
    assert folders, "no package found"
    assert folders <= held, f"not in the wheel: {sorted(folders - held)}"


def test_the_wheel_holds_every_vector(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    manifest = json.loads(MANIFEST.read_text())
    files = {f"linattn_verify/known_answers/{e['file']}" for e in manifest["vectors"]}
    assert len(files) == VECTORS
    assert files <= names, sorted(files - names)[:5]
    for name in ("manifest.json", "README.md", "__init__.py"):
        assert f"linattn_verify/known_answers/{name}" in names


@pytest.fixture(scope="module")
def installed(wheel: Path) -> Path:
    """The python of a fresh venv holding the wheel."""
    tmp = wheel.parent
    pip = [sys.executable, "-m", "pip", "-q"]
    venv = tmp / "venv"
    assert _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp).returncode == 0
    python = venv / "bin" / "python"
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp)
    Path(site.stdout.strip(), "borrowed.pth").write_text(sysconfig.get_path("purelib") + "\n")
    into = _run([*pip, "--python", str(python), "install", "--no-deps", str(wheel)], tmp)
    assert into.returncode == 0, into.stderr
    return python


def test_the_package_and_its_vectors_come_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    code = "from linattn_verify import known_answers; print(known_answers.DEFAULT_DIR)"
    where = _run([str(installed), "-c", code], tmp_path)  # one interpreter: torch loads once
    found = Path(where.stdout.strip())
    assert found.parts[-2:] == ("linattn_verify", "known_answers"), where.stdout + where.stderr
    assert installed.parents[1] in found.parents, found  # in the venv, not the repository
    assert len(list((found / "vectors").glob("*.json"))) == VECTORS


def test_known_answers_check_from_another_folder(installed: Path, tmp_path: Path) -> None:
    args = ["known-answers", "check", "--sample", "2", "--quiet"]
    done = _run([str(installed), "-m", "linattn_verify", *args], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{VECTORS} vectors: ok" in done.stdout


def test_vet_kat_of_a_kernel_outside_the_repository(installed: Path, tmp_path: Path) -> None:
    (tmp_path / "mykernel.py").write_text(textwrap.dedent(KERNEL))
    report = tmp_path / "vet.json"
    args = ["vet", "mykernel.py:attn", "--feature-map", "elu", "--kat", "--dtypes", "float32"]
    args += ["--long", "0", "--no-envelope", "--quiet", "--json", str(report)]
    done = _run([str(installed), "-m", "linattn_verify", *args], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {row["name"]: row for row in json.loads(report.read_text())["checks"]}
    assert rows["known-answers"]["status"] == "pass", rows["known-answers"]
    assert "6 vectors" in rows["known-answers"]["detail"]
