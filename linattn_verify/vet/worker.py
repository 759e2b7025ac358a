"""The implementation under test runs in a worker process: an exception, a crash (segfault,
abort) or a hang of the implementation becomes a failed check, and vet lives on to print its
verdict. The worker loads the implementation once, then runs tasks (requests.Task) sent over a
pipe. What the implementation prints (its stdout and stderr, Python's or a C library's) goes
to a file of the parent's choosing, not to the terminal, where the verdict is the last thing
(KernelOutput)."""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import resource
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..accuracy.bound import feature_model
from ..checks import ALL_CHECKS, not_applicable
from ..checks.core import in_plan, watching
from ..regimes import regime_of
from ..specs import SpecError
from ..under_test import Implementation, ImplementationFailure
from .requests import Task
from .tasks import Row

CONTEXT = multiprocessing.get_context("spawn")  # no state inherited from the parent
# Starting the worker imports torch and the target: seconds, a minute on a busy machine; a
# target whose import takes longer than this is reported as one that cannot be loaded.
LOAD_TIMEOUT = 120.0


class WorkerHung(Exception):
    """The task did not finish within the timeout; the worker was killed."""


class WorkerDied(Exception):
    """The worker process ended without answering (a crash of the implementation)."""


# what the worker last said it runs: check, case, reproduce, ..., done (the task's planned
# cases so far: requests.Task.planned_cases) and beyond (cases beyond them: checks.core.beyond_plan)
Running = dict[str, Any]


def describe(impl: Implementation) -> dict[str, Any]:
    """The implementation's name, spec, claimed cost, and the checks that do not apply (with
    why)."""
    return {
        "name": impl.name,
        "spec": impl.spec,
        "cost": impl.cost,
        "triton": impl.triton,
        "tf32": impl.tf32,
        "dtypes": impl.dtypes,
        "head_dims": impl.head_dims,
        "not_applicable": {n: r for n in ALL_CHECKS if (r := not_applicable(n, impl))},
    }


def kernel_files(impl: Implementation) -> dict[str, str]:
    """The files a target's kernel is read from, each with the SHA-256 of its text as the
    worker loaded it: the target's file (path.py:fn) or its module's (module:fn); none for
    a built-in form, an adapter's library or a callable. Triton's interpreter reads a
    kernel's source again, by line, at each call, so an edit made while vet runs changes
    what later calls run (edited_since)."""
    if impl.source.kind != "target":
        return {}
    module_name = impl.source.name.rpartition(":")[0]
    if module_name.endswith(".py"):
        path = Path(module_name)
    else:
        path = Path(getattr(sys.modules.get(module_name), "__file__", None) or "")
    if not path.is_file():
        return {}
    return {str(path.resolve()): _digest(path)}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def edited_since(files: dict[str, str]) -> tuple[str, float] | None:
    """(the first of kernel_files' `files` whose text is no longer the one loaded, the
    time it was last modified, seconds since the epoch), or None when none changed (one
    removed counts as changed, at the time of asking)."""
    for name, digest in files.items():
        path = Path(name)
        try:
            if _digest(path) != digest:
                return name, path.stat().st_mtime
        except OSError:
            return name, time.time()
    return None


def run_task(impl: Implementation, task: Task) -> list[Row]:
    """One task, its bounds under its feature model (task.features, accuracy/bound.py); an
    exception that escapes it (the implementation raising outside a check, a sampler that
    cannot be loaded) is a failed row naming it."""
    try:
        with feature_model(task.features):
            return task.run(impl)
    except Exception as err:  # the target's failure is a finding, not a crash of vet
        row = {"name": task.name, "status": "fail", "detail": f"{type(err).__name__}: {err}"}
        return [{**row, "cause": "contract"} if isinstance(err, ImplementationFailure) else row]


@dataclass(frozen=True)
class KernelOutput:
    """The file the workers of one vet run write the implementation's stdout and stderr to
    (appended: a restarted worker adds to it)."""

    path: Path

    @classmethod
    def new(cls) -> KernelOutput:
        """An empty file in the temporary directory, vet-kernel-*.log."""
        fd, name = tempfile.mkstemp(prefix="vet-kernel-", suffix=".log")
        os.close(fd)
        return cls(Path(name))

    def lines(self) -> int:
        """How many lines the implementation printed (a last one without its newline too)."""
        data = self.path.read_bytes() if self.path.exists() else b""
        return data.count(b"\n") + (not data.endswith(b"\n") and bool(data))

    def redirect(self) -> None:
        """This process's file descriptors 1 and 2 (and so sys.stdout, sys.stderr) into the
        file, from now on."""
        sys.stdout.flush()
        sys.stderr.flush()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)


def _serve(conn, declared: Implementation, output: KernelOutput | None) -> None:
    torch.set_num_threads(1)  # thousands of small calls; see stats/estimators.one_thread
    if output is not None:
        output.redirect()
    try:
        impl = declared.load()
    except Exception as err:  # reported to the parent as a usage error
        conn.send(
            ("error", str(err) if isinstance(err, SpecError) else f"{type(err).__name__}: {err}")
        )
        return
    conn.send(("ready", {**describe(impl), "files": kernel_files(impl)}))
    while (task := conn.recv()) is not None:
        done = beyond = 0  # the cases the task's plan counts, and those beyond it

        def running(check: str, case) -> None:
            nonlocal done, beyond
            if case is None:  # the check has returned
                conn.send(("running", None))
                return
            if in_plan():
                done += 1
            else:
                beyond += 1
            regime = regime_of(case, impl.spec)
            reproduce = impl.reproduce(check, case)
            said = {"check": check, "case": case.to_json(), "regime": regime, "done": done}
            said["beyond"] = beyond
            conn.send(("running", {**said, "reproduce": reproduce}))

        with watching(running):
            rows = run_task(impl, task)
        sys.stdout.flush()  # what the task printed is in the file before the parent reads it
        sys.stderr.flush()
        conn.send(("rows", (rows, max_rss())))


def max_rss() -> int:
    """This process's peak resident memory so far, in bytes (Linux counts KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Worker:
    """A worker process holding the loaded implementation (declared: resolve(load=False)),
    its prints into `output` (None: to this process's terminal). max_rss: its peak resident
    memory in bytes after the last task that returned."""

    def __init__(
        self, declared: Implementation, timeout: float, output: KernelOutput | None = None
    ) -> None:
        self.timeout = timeout
        self.max_rss = 0
        self.running: Running | None = None  # the case a check of the task is running
        self._conn, child = CONTEXT.Pipe()
        self._process = CONTEXT.Process(target=_serve, args=(child, declared, output), daemon=True)
        self._process.start()
        child.close()
        try:
            self.description = self._receive("loading the target", LOAD_TIMEOUT)
        except (WorkerHung, WorkerDied) as err:
            raise SpecError(f"cannot load {declared.name}: {err}") from None

    def _receive(
        self, what: str, timeout: float, on_case: Callable[[Running], None] | None = None
    ) -> Any:
        """The answer; on the way, each case the task runs (self.running, on_case)."""
        deadline = time.monotonic() + timeout
        while True:
            if not self._conn.poll(max(0.0, deadline - time.monotonic())):
                self.close()
                raise WorkerHung(f"{what} took longer than {timeout:g} s (killed)")
            try:
                kind, payload = self._conn.recv()
            except (EOFError, OSError):
                how = self._exit()
                self.close()
                raise WorkerDied(f"{what}: the worker process died ({how})") from None
            if kind == "error":
                self.close()
                raise SpecError(payload)
            if kind != "running":
                return payload
            self.running = payload
            if on_case is not None and payload is not None:
                on_case(payload)

    def _exit(self) -> str:
        self._process.join(5)
        code = self._process.exitcode
        if code is not None and code < 0:
            try:
                return f"killed by signal {signal.Signals(-code).name}"
            except ValueError:  # a real-time signal has no name
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def run(
        self,
        task: Task,
        timeout: float | None = None,
        on_case: Callable[[Running], None] | None = None,
    ) -> list[Row]:
        """The rows of `task`; WorkerHung past `timeout` (default: the worker's), WorkerDied
        when it crashes (self.running: the case it was running, if any)."""
        what = task.name
        self.running = None
        try:
            self._conn.send(task)
        except OSError:  # the worker died between tasks
            how = self._exit()
            self.close()
            raise WorkerDied(f"{what}: the worker process died ({how})") from None
        rows, self.max_rss = self._receive(what, timeout or self.timeout, on_case)
        return rows

    def close(self) -> None:
        if self._process.is_alive():
            with contextlib.suppress(OSError):  # a worker stuck in a task cannot read it
                self._conn.send(None)
            self._process.join(1)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
