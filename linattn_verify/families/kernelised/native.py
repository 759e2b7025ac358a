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
import shlex
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


def _private_dir(path: Path) -> bool:
    """Whether path is a directory of ours that nobody else can write (a library loaded
    from it runs as our code)."""
    info = path.stat()
    return path.is_dir() and info.st_uid == os.getuid() and not info.st_mode & 0o022


def _cache_dir() -> Path | None:
    """~/.cache/linattn_verify (or under XDG_CACHE_HOME), else a private folder in the
    temporary directory; None when neither is ours alone."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    for path in (base / "linattn_verify", Path(tempfile.gettempdir()) / f"linattn-{os.getuid()}"):
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            if _private_dir(path):
                return path
        except OSError:
            continue
    return None


def _cpu() -> bytes:
    """What -march=native compiles for: the CPU's model and flags (a cached library built
    on another CPU, e.g. in a shared home directory, is never loaded here)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return os.uname().machine.encode()
    keep = [line for line in lines if line.startswith(("model name", "flags"))][:2]
    return "\n".join(keep).encode()


def _build(compiler: list[str], target: Path) -> None:
    """Compile native.c to `target`, atomically (concurrent test workers may race)."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so")
    os.close(fd)
    try:
        done = subprocess.run(
            [*compiler, *FLAGS, "-o", tmp, str(SOURCE)],
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
    compiler = shlex.split(os.environ.get("CC", "")) or [shutil.which("cc") or shutil.which("gcc")]
    if compiler[0] is None:
        return None, "off: no C compiler (cc) found"
    folder = _cache_dir()
    if folder is None:
        return None, "off: no private cache folder to build native.c in"
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join((*compiler, *FLAGS)).encode() + _cpu())
    target = folder / f"native-{key.hexdigest()[:16]}.so"
    command = " ".join(compiler)
    try:
        if not target.exists():
            _build(compiler, target)
        try:
            lib = ctypes.CDLL(str(target))
        except OSError:  # a damaged file: built again once
            _build(compiler, target)
            lib = ctypes.CDLL(str(target))
        function = lib.elu_features
    except (OSError, AttributeError, subprocess.SubprocessError) as error:
        return None, f"off: building native.c with {command} failed: {error}"
    pointer, integer = ctypes.c_void_p, ctypes.c_int64
    function.restype = ctypes.c_int
    function.argtypes = [pointer, *[integer] * 5, pointer, integer, pointer]
    function.argtypes += [*[integer] * 3, pointer, integer, ctypes.c_float]
    return lib, f"on ({target.name}, {command} {' '.join(FLAGS)})"


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

    With z (batch, ceil(rows / group), cols) and den (batch, rows[, 1]): den[b, r] =
    phi(x[b, r]) . z[b, r // group], in the same pass. Returns False, and the results are
    not to be used, when some x is NaN, +inf or below `low` (which must be >= DOMAIN_MIN).
    """
    if x.stride(-1) != 1:
        x = x.contiguous()
    batch, rows, cols = x.shape
    tensors = [t for t in (x, out, z, den) if t is not None]
    if not all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors):
        raise ValueError("native.c takes CPU float32 tensors")
    if low < DOMAIN_MIN:
        raise ValueError(f"low must be >= {DOMAIN_MIN}, got {low}")
    if out.shape != x.shape or out.stride()[1:] != (cols, 1):
        raise ValueError(f"out must have shape {tuple(x.shape)} and contiguous rows")
    if z is None:
        zs = (None, 0, 0, 1, None, 0)
    elif (
        group < 1
        or z.shape != (batch, -(-rows // group), cols)
        or z.stride(-1) != 1
        or den is None
        or den.shape[:2] != (batch, rows)
        or den.stride(1) != 1
    ):
        raise ValueError("z must be (batch, ceil(rows / group), cols), den (batch, rows)")
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
