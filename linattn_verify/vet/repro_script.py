"""The text of a reproducer (repro.py writes it): a script that needs Python, torch and the
kernel's own code, not linattn_verify. It loads the kernel (module:function from the
directory vet ran from, path/file.py:function by its path; --impl another one, its corrected
twin), calls it on the inputs saved beside it with the keywords vet used (through the code an
adapter has around its call, when it has some), and asserts the output at the worst elements
against their exact values within the stated tolerance. A Triton kernel runs on a GPU when
there is one, else in Triton's interpreter on CPU tensors with two workarounds of a few
lines for what the bare interpreter does not do (DEVICE_TRITON: the autotuner's first
config, untimed; loop variables as tensors), not linattn_verify's shims; a finding the
interpreter cannot show, on a GPU alone (DEVICE_GPU)."""

from __future__ import annotations

from string import Template

SCRIPT = Template('''\
#!/usr/bin/env python3
"""Finding $number of `python -m linattn_verify vet $vetted`, reproduced.

$headline

Standalone: Python, torch and the kernel's own code (not linattn_verify). The inputs are
$inputs beside this file (torch.save: their exact values, in the kernel's layout, with the
keywords vet called it with); the expected values are linattn_verify's exact reference at
the worst element(s), to 17 significant digits.

    python $script                          # the kernel vet judged: fails
    python $script --impl module:function   # another kernel, e.g. its corrected twin
    python $script --impl path/file.py:function
$called
The case: $case
vet's check: $reproduce
"""

import argparse
import importlib
import importlib.util
import math
import sys
from pathlib import Path

import torch

TARGET = $target_literal
ROOT = $root_literal  # the directory vet ran from: a module:function target imports from it
INPUTS = Path(__file__).with_name($inputs_literal)
LAYOUT = $layout_literal  # "bhnd": (B, H, N, d) in and out; "bnhd": (B, N, H, d)
$device

# ((b, h, i, c) of the (B, H, N, dv) output, its exact value, the tolerance)
EXPECTED = [
$expected]
$why

def load(target):
    """The callable of module:function (imported from ROOT) or path/file.py:function."""
    where, _, name = target.rpartition(":")
    if where.endswith(".py"):
        spec = importlib.util.spec_from_file_location(Path(where).stem, where)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        sys.path.insert(0, ROOT)
        module = importlib.import_module(where)
    for part in name.split("."):
        module = getattr(module, part)
    return module


$call

def on_device(value):
    if isinstance(value, torch.Tensor):
        return value.to(DEVICE)
    if isinstance(value, (tuple, list)):
        return type(value)(on_device(v) for v in value)
    if isinstance(value, dict):  # the keywords: g=, beta=, initial_state=, ...
        return {key: on_device(v) for key, v in value.items()}
    return value


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default=TARGET, help="module:function or path/file.py:function")
    kernel = load(parser.parse_args().impl)
    saved = torch.load(INPUTS, weights_only=True)
    result = call(kernel, *on_device(saved["args"]), **on_device(saved["kwargs"]))
    out = result[0] if isinstance(result, (tuple, list)) else result  # (out, final_state)
    if LAYOUT == "bnhd":
        out = out.transpose(1, 2)
    for index, exact, tolerance in EXPECTED:
        got = float(out[index])
        where = f"out[{', '.join(map(str, index))}] (b, h, i, c)"
        if math.isnan(exact):
            assert math.isnan(got), f"{where} = {got!r}: the exact value is 0/0, NaN expected"
            print(f"{where} = nan, as the exact 0/0: ok")
            continue
        assert math.isfinite(got), f"{where} = {got!r}, exact {exact!r}: not finite"
        error = abs(got - exact)
        assert error <= tolerance, (
            f"{where} = {got!r}, exact {exact!r}: error {error:.6g} > tolerance {tolerance:.6g}"
        )
        print(f"{where} = {got!r}, exact {exact!r}: error {error:.6g} <= {tolerance:.6g}: ok")


if __name__ == "__main__":
    main()
''')

# where the kernel runs: the device vet ran it on
DEVICE = Template("DEVICE = $device_literal")

# a Triton kernel: on a GPU as it is, else in Triton's interpreter
DEVICE_TRITON = """
# Its kernels are Triton's: on a GPU as they are; without one, in Triton's interpreter on
# CPU tensors, with two workarounds for what the bare interpreter does not do.
import os

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# vet judged IEEE float32 products; a GPU's tl.dot takes float32 inputs as TF32 by default
os.environ["TRITON_F32_DEFAULT"] = "ieee"  # before triton and the kernel are imported
if DEVICE == "cpu":  # only for running without a GPU
    import ast

    os.environ["TRITON_INTERPRET"] = "1"  # before triton and the kernel are imported
    from triton.runtime import interpreter
    from triton.runtime.autotuner import Autotuner

    # The autotuner times its configs through a GPU driver, and the interpreter has none
    # ("0 active drivers", triton-lang/triton#7932): run the first config, untimed.
    first_configs = Autotuner.prune_configs
    Autotuner.prune_configs = lambda self, kwargs: first_configs(self, kwargs)[:1]

    # `for i in range(n)` in a kernel: i is a tensor when compiled, a Python int in the
    # interpreter, where i.to(tl.int64) fails (fla's chunk kernels): make it a tensor.
    class TensorLoops(interpreter.ASTTransformer):
        def visit_Call(self, node):
            node = self.generic_visit(node)
            if isinstance(node.func, ast.Name) and node.func.id == "range":
                node.func = ast.Name("tensor_range", ast.Load())
            return node

    to_tensor = interpreter.interpreter_semantic.to_tensor
    interpreter.tensor_range = lambda *bounds: map(to_tensor, range(*bounds))
    interpreter.FunctionRewriter.ast_transformer = TensorLoops()\
"""

# a Triton kernel's finding that Triton's interpreter does not show
DEVICE_GPU = Template("""
$comment
DEVICE = "cuda"
if not torch.cuda.is_available():
    sys.exit(f"{Path(__file__).name} needs a GPU: $why")\
""")

# the kernel called as it is
CALL = """\
def call(kernel, *args, **kwargs):
    return kernel(*args, **kwargs)
"""

# the kernel called through the code an adapter has around it (adapters.base.calling)
CALL_AROUND = Template("""\
def call(kernel, q, k, v):
$docstring
    return $call
""")
