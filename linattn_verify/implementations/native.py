"""native.c, the one C kernel of the built-in forms: elu + 1 features in one pass.

Eager torch takes five passes over memory for exp(min(x, 0)) + max(x, 0) (about 1.7 ns an
element on one core, more than the matmuls it feeds); native.c takes one (about 0.5 ns)
and can write each row's dot product with a key sum beside it, the denominator of the
linear forms. It is compiled on first use with the machine's C compiler (-O3
-march=native) into a cache directory and loaded with ctypes. Only CPU float32 without
autograd takes it; without a compiler, or with LINATTN_VERIFY_NATIVE=0, the forms use
eager torch: the same results within the accuracy model, slower. `status()` says which.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("native.c")
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-shared", "-fPIC")
SWITCH = "LINATTN_VERIFY_NATIVE"  # "0" turns the kernel off
COMPILE_SECONDS = 120
DOMAIN_MIN = -87.0  # native.c's exponential is for x >= -87 (e^x a normal float)


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    path = Path(base) / "linattn_verify"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        path = Path(tempfile.gettempdir()) / f"linattn_verify-{os.getuid()}"
        path.mkdir(exist_ok=True)
    return path


def _cpu() -> bytes:
    """What -march=native compiles for: the CPU's model and flags (a cached library built
    on another CPU, e.g. in a shared home directory, is never loaded here)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return os.uname().machine.encode()
    keep = [line for line in lines if line.startswith(("model name", "flags"))][:2]
    return "\n".join(keep).encode()


def _build(compiler: str, target: Path) -> None:
    """Compile native.c to `target`, atomically (concurrent test workers may race)."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so")
    os.close(fd)
    try:
        done = subprocess.run(
            [compiler, *FLAGS, "-o", tmp, str(SOURCE)],
            capture_output=True,
            text=True,
            timeout=COMPILE_SECONDS,
        )
        if done.returncode != 0:
            raise OSError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@functools.cache
def _library() -> tuple[ctypes.CDLL | None, str]:
    if os.environ.get(SWITCH) == "0":
        return None, f"off ({SWITCH}=0)"
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None, "off: no C compiler (cc) found"
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join((compiler, *FLAGS)).encode() + _cpu())
    target = _cache_dir() / f"native-{key.hexdigest()[:16]}.so"
    try:
        if not target.exists():
            _build(compiler, target)
        lib = ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError) as error:
        return None, f"off: building native.c with {compiler} failed: {error}"
    pointer, integer = ctypes.c_void_p, ctypes.c_int64
    lib.elu_features.restype = ctypes.c_int
    lib.elu_features.argtypes = [pointer, *[integer] * 5, pointer, integer, pointer]
    lib.elu_features.argtypes += [*[integer] * 3, pointer, integer, ctypes.c_float]
    return lib, f"on ({target.name}, {compiler} {' '.join(FLAGS)})"


def status() -> str:
    """Whether the kernel is in use, and why not."""
    return _library()[1]


def usable(*tensors: torch.Tensor) -> bool:
    """Whether the kernel is built and can take these tensors (CPU float32; the kernel
    records no gradient, so callers keep it away from autograd)."""
    cpu32 = all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
    return cpu32 and _library()[0] is not None


def elu_features(
    x: torch.Tensor,
    out: torch.Tensor,
    low: float,
    z: torch.Tensor | None = None,
    group: int = 1,
    den: torch.Tensor | None = None,
) -> bool:
    """elu(x) + 1 of x (batch, rows, cols) into `out` (same shape, rows contiguous).

    With z (batch, rows / group, cols) and den (batch, rows[, 1]): den[b, r] =
    phi(x[b, r]) . z[b, r // group], in the same pass. Returns False, and the results are
    not to be used, when some x is NaN, +inf or below `low` (which must be >= DOMAIN_MIN).
    """
    if x.stride(-1) != 1:
        x = x.contiguous()
    batch, rows, cols = x.shape
    if out.shape != x.shape or out.stride()[1:] != (cols, 1):
        raise ValueError(f"out must have shape {tuple(x.shape)} and contiguous rows")
    if z is None:
        zs = (None, 0, 0, group, None, 0)
    elif z.stride(-1) != 1 or den is None or den.shape[:2] != (batch, rows) or den.stride(1) != 1:
        raise ValueError("z needs a unit last stride, and den (batch, rows) beside it")
    else:
        zs = (z.data_ptr(), z.stride(0), z.stride(1), group, den.data_ptr(), den.stride(0))
    lib = _library()[0]
    bad = lib.elu_features(
        x.data_ptr(),
        batch,
        rows,
        cols,
        x.stride(0),
        x.stride(1),
        out.data_ptr(),
        out.stride(0),
        *zs,
        low,
    )
    return not bad
