"""The text of a reproducer (repro.py writes it): a script that needs Python, torch and the
kernel's own code, not linattn_verify. It loads the kernel (module:function from the
directory vet ran from, path/file.py:function by its path; --impl another one, its corrected
twin), calls it on the inputs saved beside it with the keywords vet used, and asserts the
output at the worst elements against their exact values within the stated tolerance."""

from __future__ import annotations

from string import Template

SCRIPT = Template('''\
#!/usr/bin/env python3
"""Finding $number of `python -m linattn_verify vet $target`, reproduced.

$headline

Standalone: Python, torch and the kernel's own code (not linattn_verify). The inputs are
$inputs beside this file (torch.save: their exact values, in the kernel's layout, with the
keywords vet called it with); the expected values are linattn_verify's exact reference at
the worst element(s), to 17 significant digits.

    python $script                          # the kernel vet judged: fails
    python $script --impl module:function   # another kernel, e.g. its corrected twin
    python $script --impl path/file.py:function

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
DEVICE = $device_literal
LAYOUT = $layout_literal  # "bhnd": (B, H, N, d) in and out; "bnhd": (B, N, H, d)

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


def on_device(value):
    if isinstance(value, torch.Tensor):
        return value.to(DEVICE)
    if isinstance(value, (tuple, list)):
        return type(value)(on_device(v) for v in value)
    return value


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default=TARGET, help="module:function or path/file.py:function")
    kernel = load(parser.parse_args().impl)
    saved = torch.load(INPUTS, weights_only=True)
    result = kernel(*on_device(saved["args"]), **on_device(saved["kwargs"]))
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
        error = abs(got - exact)
        assert error <= tolerance, (
            f"{where} = {got!r}, exact {exact!r}: error {error:.6g} > tolerance {tolerance:.6g}"
        )
        print(f"{where} = {got!r}, exact {exact!r}: error {error:.6g} <= {tolerance:.6g}: ok")


if __name__ == "__main__":
    main()
''')
