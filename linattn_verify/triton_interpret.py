"""Triton's interpreter (TRITON_INTERPRET=1) made to run shipped Triton kernels on CPU tensors:
the environment set before triton is imported, and the shims for what the interpreter of the
triton versions in SHIMMED_FOR does differently from a GPU, each citing its upstream issue.

- The autotuner benchmarks every config through a GPU driver ("0 active drivers"): the
  interpreter runs the config the caller chose (`use_config`), one per kernel, chosen among
  the configs that differ in what the kernel computes (constexprs: block sizes and others;
  num_warps and num_stages only schedule work on a GPU). triton-lang/triton#7932 (no switch
  to skip benchmarking; PR #8691 open).
- A `for i in range(...)` loop variable is a Python int in the interpreter and a tensor in
  compiled code, so `i.to(tl.int64)` fails: loop variables of range/tl.range become tensors
  of the bounds' promoted integer type, as the compiler types them (int64 when a bound is);
  and builtin min/max on tensors are Python's in the interpreter (one operand, its own
  type) and tl.minimum/tl.maximum compiled (the promoted type): they call triton's
  builtin_min/builtin_max. No upstream issue found for either (searched
  triton-lang/triton, 2026-12). Both matter to int32 offsets only (watching_offsets).
- bfloat16 is held as raw uint16 bits, and tl.dot, arithmetic and reductions act on the bits
  (triton-lang/triton#11584): bfloat16 values are carried as float32 numbers, each a bfloat16
  value, decoded on load and rounded to nearest even on store and on every cast and result.
- A float store whose value is not of the pointer's element type (a float64 tl.dot into a
  float32 accumulator makes one) writes the value's bytes, garbage, where compiling the
  kernel fails: it raises (no upstream issue found).
- `running(tf32=True)` rounds the inputs of a float32 tl.dot to TF32 (a 10-bit mantissa, round to
  nearest even), what an Ampere-or-newer GPU computes with input_precision "tf32" (the
  default); without it the interpreter computes IEEE float32 products. Each such dot is
  counted (`STATE.tf32_dots`): the evidence vet's "tf32-products" cause needs.

And two instruments: `watching_offsets()` records the int32 offsets a kernel adds to pointers,
per tensor (a GPU wraps them at 2^31; the interpreter adds them in 64 bits); every float cast
to a coarser precision (an explicit `.to`, or a store's implicit one) is counted by source
line and precisions (`STATE.narrowed`): the evidence vet's "narrowed" cause needs; and a
narrowed value stored into a tensor that a later launch loads from (an intermediate kept
between kernels in the coarser precision) is counted by the storing line and the tensor's
argument name (`STATE.stored`): the evidence vet's "stored-intermediates" cause needs. And one
saving, no change to what is computed: a launch patches triton.language for the interpreter
once, and the @jit functions the kernel calls no longer patch it again on each call
(_patch_once).
"""

from __future__ import annotations

import ast
import functools
import os
import sys
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from .specs import SpecError

SHIMMED_FOR = ("3.9.0",)
INSTALL = "triton==3.9.0 numpy packaging"


class TritonUnavailable(SpecError):
    """Triton is missing, or a version the shims do not know (a usage error: exit 2)."""


@dataclass
class _State:
    """What the shims were told and what they saw: the config variant in use, the TF32
    switch and the tl.dots whose float32 inputs it rounded to TF32 (a count), each
    autotuned kernel's distinct configs (by its name), and the autotuners whose choice must
    be forgotten when the variant changes."""

    variant: int = 0
    tf32: bool = False
    tf32_dots: int = 0
    # (from, to, "file:line") -> how many float casts to a coarser precision ran there
    narrowed: dict[tuple[str, str, str], int] = field(default_factory=dict)
    # (from, to, "file:line", "kernel's argument") -> the later launches that loaded what a
    # narrowed store there wrote (_watch_stores)
    stored: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    configs: dict[str, list[dict]] = field(default_factory=dict)
    tuners: weakref.WeakSet = field(default_factory=weakref.WeakSet)
    installed: bool = False
    offsets: Int32Offsets | None = None  # while watching_offsets()


@dataclass
class Int32Offsets:
    """What watched launches did with int32 pointer offsets: the tensors each launch is given
    (start and end address of the memory it spans, element count, argument name), and per
    kernel and tensor ("kernel's argument") the largest |offset|, in elements, added in
    int32 to a pointer into it, with the tensor's element count."""

    tensors: list[tuple[int, int, int, str]] = field(default_factory=list)
    kernel: str = ""
    largest: dict[str, tuple[int, int]] = field(default_factory=dict)

    def add(self, base: int, offset: int) -> None:
        """The offset against the narrowest tensor whose memory holds `base`."""
        holding = [t for t in self.tensors if t[0] <= base < t[1]]
        if holding:
            _, _, count, name = min(holding, key=lambda t: t[1] - t[0])
            label = f"{self.kernel}'s {name}"
            seen = self.largest.get(label, (0, count))[0]
            self.largest[label] = (max(offset, seen), count)


STATE = _State()


def enable() -> None:
    """Set TRITON_INTERPRET=1, import triton and install the shims (once). triton.jit reads
    the variable when it decorates a kernel, so it holds for the kernels of every module
    imported afterwards (triton's own library is converted if it came before).
    TritonUnavailable if triton is missing or a version the shims were
    not written for."""
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton
    except ImportError as err:
        raise TritonUnavailable(
            f"cannot import triton ({err}); `pip install {INSTALL}` or "
            "`pip install linattn-verify[triton]`"
        ) from None
    if triton.__version__ not in SHIMMED_FOR:
        raise TritonUnavailable(
            f"triton {triton.__version__} is installed; the interpreter shims are written for "
            f"triton {', '.join(SHIMMED_FOR)} (`pip install {INSTALL}`)"
        )
    if not STATE.installed:
        _install()
        STATE.installed = True


def forget_configs() -> None:
    """Forget the autotuned kernels seen so far (another implementation's), and the configs
    their autotuners cached, so that variants() and describe() count the next calls' alone
    (a cached config skips prune_configs, where they are recorded)."""
    _choose(0)
    STATE.configs.clear()
    for tuner in list(STATE.tuners):
        tuner.cache.clear()


def variants() -> int:
    """How many config variants the autotuned kernels seen so far have: variant i runs
    config i (mod its count) of every kernel, so every distinct config runs in some variant."""
    return max((len(c) for c in STATE.configs.values()), default=1)


def describe(variant: int) -> str:
    """The configs variant `variant` runs, kernel by kernel: "chunk_fwd_kernel_o BK=64 BV=64"."""
    parts = []
    for kernel, configs in sorted(STATE.configs.items()):
        kwargs = configs[variant % len(configs)]
        short = kernel.rsplit(".", 1)[-1]  # the kernel's name; the key keeps its module
        parts.append(" ".join([short, *(f"{k}={v}" for k, v in kwargs.items())]))
    return "; ".join(parts) or "no autotuned kernel"


@contextmanager
def use_config(variant: int) -> Iterator[None]:
    """Run the autotuned kernels in config variant `variant` inside the block."""
    previous = STATE.variant
    _choose(variant)
    try:
        yield
    finally:
        _choose(previous)


@contextmanager
def running(tf32: bool) -> Iterator[None]:
    """One call of a kernel in the interpreter: float32 tl.dot inputs rounded to TF32 when
    `tf32` (an Ampere-or-newer GPU's default), IEEE float32 products otherwise; numpy's
    floating-point warnings off (an overflow in a cast is the kernel's result, for the
    checks to judge, not a line on stderr)."""
    previous, STATE.tf32 = STATE.tf32, tf32
    try:
        with np.errstate(all="ignore"):
            yield
    finally:
        STATE.tf32 = previous


@contextmanager
def watching_offsets() -> Iterator[Int32Offsets]:
    """The int32 pointer offsets of the launches made inside (Int32Offsets)."""
    previous, STATE.offsets = STATE.offsets, Int32Offsets()
    try:
        yield STATE.offsets
    finally:
        STATE.offsets = previous


def _choose(variant: int) -> None:
    if variant != STATE.variant:
        STATE.variant = variant
        for tuner in list(STATE.tuners):
            tuner.cache.clear()


def _install() -> None:
    from triton.runtime import autotuner, interpreter

    _reinterpret_library()
    _shim_autotuner(autotuner.Autotuner)
    _shim_loop_variables(interpreter)
    _shim_bfloat16(interpreter)
    _shim_store_types(interpreter)
    _shim_dot(interpreter)
    _watch_offsets(interpreter)
    _watch_narrowing(interpreter)
    _watch_stores(interpreter)
    _patch_once(interpreter)


def _reinterpret_library() -> None:
    """triton.language's own @jit functions (tl.cdiv, tl.sigmoid, ...) made interpreted ones
    when triton was imported before TRITON_INTERPRET was set (torch.utils.flop_counter
    imports it): triton.jit chose compiled JITFunctions then, which raise "Cannot call
    @triton.jit'd outside of the scope of a kernel" inside an interpreted kernel."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    for name, module in list(sys.modules.items()):
        if name == "triton.language" or name.startswith("triton.language."):
            for attr, value in list(vars(module).items()):
                if isinstance(value, JITFunction):
                    setattr(module, attr, InterpretedFunction(value.fn))


def _shim_autotuner(tuner_class: type) -> None:
    """Autotuner.prune_configs returns one config, the variant's (triton#7932): the
    autotuner then runs it without benchmarking."""
    prune = tuner_class.prune_configs

    def chosen_config(self, kwargs):
        pruned = prune(self, kwargs)
        distinct: dict[tuple, object] = {}
        for config in pruned:
            distinct.setdefault(tuple(sorted(config.kwargs.items())), config)
        name = f"{self.base_fn.__module__}.{self.base_fn.__qualname__}"
        STATE.configs[name] = [dict(k) for k in distinct]
        STATE.tuners.add(self)
        configs = list(distinct.values())
        return [configs[STATE.variant % len(configs)]]

    tuner_class.prune_configs = chosen_config


LOOP_TYPE = "_linattn_loop_type"  # the name the rewritten loops call for their variable's type
BUILTINS = {"min": "_linattn_builtin_min", "max": "_linattn_builtin_max"}  # and min, max


class _LoopVariables(ast.NodeTransformer):
    """`for i in range(a, b, c)` / `tl.range(...)`: t = LOOP_TYPE(interpreter_semantic, a, b,
    c) before the loop (its bounds' promoted integer type, as the compiler types the
    variable: int64 when a bound is), and i = a tensor of type t first in the body;
    static_range's stays an int. And min(a, b) and max(a, b) call triton's builtin_min and
    builtin_max, as compiled code does (tl.minimum: the operands' promoted type), not
    Python's (one operand, its own type)."""

    loops = 0  # numbers each loop's type variable

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name in BUILTINS and not node.keywords:  # min(x, key=...) is host code's
            node.func = ast.copy_location(ast.Name(BUILTINS[name], ast.Load()), node.func)
        return node

    def visit_For(self, node: ast.For) -> ast.AST | list[ast.AST]:
        self.generic_visit(node)
        call = node.iter
        func = call.func if isinstance(call, ast.Call) else None
        name = getattr(func, "attr", None) or getattr(func, "id", None)
        if name != "range" or not isinstance(node.target, ast.Name):
            return node
        given = list(call.args)
        bounds = [ast.Constant(0), given[0], ast.Constant(1)] if len(given) == 1 else given
        bounds += [ast.Constant(1)] * (3 - len(bounds))
        self.loops += 1
        kind = f"{LOOP_TYPE}_{self.loops}"
        semantic = ast.Name(id="interpreter_semantic", ctx=ast.Load())
        typed = ast.Assign(
            targets=[ast.Name(id=kind, ctx=ast.Store())],
            value=ast.Call(ast.Name(id=LOOP_TYPE, ctx=ast.Load()), [semantic, *bounds], []),
        )
        convert = ast.Assign(
            targets=[ast.Name(id=node.target.id, ctx=ast.Store())],
            value=ast.Call(
                func=ast.Attribute(value=semantic, attr="scalar_constant", ctx=ast.Load()),
                args=[ast.Name(id=node.target.id, ctx=ast.Load())],
                keywords=[ast.keyword(arg="dtype", value=ast.Name(id=kind, ctx=ast.Load()))],
            ),
        )
        node.body.insert(0, ast.copy_location(convert, node))
        return [ast.copy_location(typed, node), node]


def _loop_type(semantic, *bounds):
    """The promoted integer type of a range loop's bounds, its variable's type (triton's code
    generator, visit_For: integer_promote_impl of lb, ub and step)."""
    types = [semantic.to_tensor(bound).dtype for bound in bounds]
    return functools.reduce(semantic.integer_promote_impl, types)


def _shim_loop_variables(interpreter) -> None:
    base = interpreter.ASTTransformer

    class Transformer(_LoopVariables, base):
        pass

    from triton.language import core

    setattr(interpreter, LOOP_TYPE, _loop_type)  # rewritten kernels see its globals
    for name, builtin in (("min", core.builtin_min), ("max", core.builtin_max)):
        semantic = interpreter.interpreter_semantic
        setattr(interpreter, BUILTINS[name], functools.partial(builtin, _semantic=semantic))
    interpreter.FunctionRewriter.ast_transformer = Transformer()
    interpreter.InterpretedFunction.rewritten_fn.clear()


def _bfloat16_bits(data):
    """float32 numbers (each already a bfloat16 value) as bfloat16's uint16 bits; a NaN
    whose payload is in the low bits alone keeps its quiet bit (not +-inf)."""
    bits = np.ascontiguousarray(data, dtype=np.float32).view(np.uint32)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return ((bits >> 16) | np.where(nan, np.uint32(0x40), np.uint32(0))).astype(np.uint16)


def _to_bfloat16(data):
    """Numbers or raw uint16 bits as float32 numbers rounded to bfloat16, to nearest even
    (NaN and infinities kept), as a GPU's cvt.rn.bf16.f32 does."""
    if data.dtype == np.uint16:
        return (data.astype(np.uint32) << 16).view(np.float32)
    bits = np.ascontiguousarray(data, dtype=np.float32).view(np.uint32)
    special = (bits & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    bias = ((bits >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF)
    rounded = (bits + bias) & np.uint32(0xFFFF0000)
    return np.where(special, bits, rounded).view(np.float32).reshape(data.shape)


def _shim_bfloat16(interpreter) -> None:
    """bfloat16 values carried as float32 numbers, rounded to bfloat16 whenever a value of
    that type is made (triton#11584): loads decode the bits, stores and bitcasts encode them,
    every other operation computes on the numbers."""
    tl, handle, builder = interpreter.tl, interpreter.TensorHandle, interpreter.InterpreterBuilder
    np_dtype, valid = interpreter._get_np_dtype, interpreter._validate_np_data_size

    scalars: dict[str, np.dtype] = {}  # a plain tl.dtype's, by name: _get_np_dtype's dict by name

    def is_bfloat16(ty) -> bool:
        """ty == tl.bfloat16; for a plain tl.dtype (most calls) its name, which is what
        dtype.__eq__ compares, without its unwrapping (a share of every operation's time)."""
        return ty.name == "bf16" if type(ty) is tl.dtype else ty == tl.bfloat16

    def get_np_dtype(ty):
        if type(ty) is not tl.dtype:
            return np.dtype(np.float32) if ty == tl.bfloat16 else np_dtype(ty)
        if (found := scalars.get(ty.name)) is None:
            found = np.dtype(np.float32) if ty.name == "bf16" else np_dtype(ty)
            scalars[ty.name] = found
        return found

    def validate(array, ty):
        return (is_bfloat16(ty) and array.dtype == np.float32) or valid(array, ty)

    post_init = handle.__post_init__

    def rounded(self):
        if is_bfloat16(self.dtype):
            self.data = _to_bfloat16(np.asarray(self.data))
        post_init(self)

    load, store, cast = builder.create_masked_load, builder.create_masked_store, builder.cast_impl
    bitcast, fabs, fp_to_fp = builder.create_bitcast, builder.create_fabs, builder.create_fp_to_fp

    def masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        if ptrs.get_element_ty() != tl.bfloat16:
            return load(self, ptrs, mask, other, cache_policy, is_volatile)
        fill = (
            np.zeros(ptrs.data.shape, np.uint16)
            if other is None
            else _bfloat16_bits(np.broadcast_to(other.data, ptrs.data.shape))
        )
        raw = interpreter._interpreter.load(ptrs.data, mask.data, fill, np.dtype(np.uint16))
        return handle(raw, tl.bfloat16)

    def masked_store(self, ptrs, value, mask, cache_policy):
        if ptrs.get_element_ty() == tl.bfloat16:
            value = handle(_bfloat16_bits(value.data), tl.uint16)
        return store(self, ptrs, value, mask, cache_policy)

    def cast_impl(self, src, dst_type):
        if tl.bfloat16 in (src.dtype.scalar, dst_type.scalar):
            return handle(src.data.astype(get_np_dtype(dst_type.scalar)), dst_type.scalar)
        return cast(self, src, dst_type)

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if tl.bfloat16 in (src.dtype.scalar, dst_type.scalar):
            return cast_impl(self, src, dst_type)
        return fp_to_fp(self, src, dst_type, rounding_mode)

    def create_bitcast(self, src, dst_type):
        if src.dtype.scalar == tl.bfloat16:
            bits = _bfloat16_bits(src.data)
            return handle(bits.view(get_np_dtype(dst_type.scalar)), dst_type.scalar)
        if dst_type.scalar == tl.bfloat16:
            return handle(src.data.view(np.uint16), tl.bfloat16)
        return bitcast(self, src, dst_type)

    def create_fabs(self, arg):
        if arg.dtype.scalar == tl.bfloat16:
            return handle(np.abs(arg.data), tl.bfloat16)
        return fabs(self, arg)

    get_np_dtype.__wrapped__ = np_dtype
    interpreter._get_np_dtype = get_np_dtype
    interpreter._validate_np_data_size = validate
    handle.__post_init__ = rounded
    builder.create_masked_load, builder.create_masked_store = masked_load, masked_store
    builder.cast_impl, builder.create_fp_to_fp = cast_impl, create_fp_to_fp
    builder.create_bitcast, builder.create_fabs = create_bitcast, create_fabs
    for name in ("create_fp_trunc", "create_fp_ext", "create_si_to_fp", "create_ui_to_fp",
                 "create_fp_to_si", "create_fp_to_ui"):  # fmt: skip
        setattr(builder, name, lambda self, src, dst_type: cast_impl(self, src, dst_type))
    builder.create_int_cast = lambda self, src, dst_type, is_signed: cast_impl(self, src, dst_type)


def _shim_store_types(interpreter) -> None:
    """A float store whose value is not of the pointer's element type raises, as compiling
    it does (tt.store's value must be of the pointer's element type). The interpreter
    writes the value's bytes instead: a float64 tl.dot into a float32 accumulator yields a
    float32 value typed float64, `.to(float64)` is then no cast, and fla's
    chunk_fwd_kernel_o writes float32 bytes into a float64 output, garbage."""
    builder = interpreter.InterpreterBuilder
    store = builder.create_masked_store

    def masked_store(self, ptrs, value, mask, cache_policy):
        target, given = ptrs.get_element_ty(), value.dtype.scalar
        if target.is_floating() and given.is_floating() and target != given:
            raise TypeError(
                f"tl.store of a {given} value through a pointer to {target} (Triton does not "
                "compile this: the value must be of the pointer's element type)"
            )
        return store(self, ptrs, value, mask, cache_policy)

    builder.create_masked_store = masked_store


def _shim_dot(interpreter) -> None:
    """With STATE.tf32, a float32 tl.dot whose input precision is TF32 (the default) rounds
    its inputs to TF32 first, as the GPU's tensor cores do, and counts itself
    (STATE.tf32_dots); IEEE and TF32x3 dots are left as they are."""
    builder = interpreter.InterpreterBuilder
    dot = builder.create_dot
    tl = interpreter.tl

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        precision = getattr(input_precision, "name", str(input_precision)).upper()
        tf32 = STATE.tf32 and precision.endswith("TF32")  # not IEEE, not TF32x3
        if tf32 and a.dtype.scalar == tl.float32 and b.dtype.scalar == tl.float32:
            STATE.tf32_dots += 1
            a = interpreter.TensorHandle(interpreter._round_f32_to_tf32(a.data), a.dtype.scalar)
            b = interpreter.TensorHandle(interpreter._round_f32_to_tf32(b.data), b.dtype.scalar)
        return dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    builder.create_dot = create_dot


def _watch_offsets(interpreter) -> None:
    """An instrument, not a fix: while watching_offsets(), each launch registers the tensors it
    is given and each int32 offset added to a pointer is recorded against the tensor the
    pointer is in (the interpreter adds it in 64 bits; a GPU wraps it at 2^31)."""
    tl, launch = interpreter.tl, interpreter.GridExecutor.__call__
    addptr = interpreter.InterpreterBuilder.create_addptr

    def call(self, *args, **kwargs):
        if (seen := STATE.offsets) is not None:
            seen.kernel, seen.tensors = self.fn.__name__, []
            for name, arg in (*zip(self.arg_names, args), *kwargs.items()):
                if isinstance(arg, torch.Tensor) and arg.numel():
                    last = sum((n - 1) * abs(s) for n, s in zip(arg.shape, arg.stride()))
                    end = arg.data_ptr() + (last + 1) * arg.element_size()
                    seen.tensors.append((arg.data_ptr(), end, arg.numel(), name))
        return launch(self, *args, **kwargs)

    def create_addptr(self, ptr, offset):
        seen = STATE.offsets
        if seen is not None and offset.dtype.scalar == tl.int32 and offset.data.size:
            largest = int(np.max(np.abs(offset.data.astype(np.int64))))
            seen.add(int(np.min(ptr.data)), largest)
        return addptr(self, ptr, offset)

    interpreter.GridExecutor.__call__ = call
    interpreter.InterpreterBuilder.create_addptr = create_addptr


# float precisions by their significand's bits, finest first (torch's names)
MANTISSA_BITS = {"float64": 53, "float32": 24, "float16": 11, "bfloat16": 8}
_TORCH_NAMES = {"fp64": "float64", "fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def _watch_narrowing(interpreter) -> None:
    """An instrument, not a fix: each float cast to a coarser precision (create_fp_trunc for
    `.to` and a store's implicit cast, create_fp_to_fp for one with a rounding mode) is
    counted in STATE.narrowed by the kernel's source line: the first frame outside triton."""
    builder = interpreter.InterpreterBuilder
    triton_dir = os.path.dirname(os.path.dirname(interpreter.__file__))

    def counted(cast):
        def narrowing_cast(self, src, dst_type, *rest):
            given = _TORCH_NAMES.get(str(src.dtype.scalar))
            target = _TORCH_NAMES.get(str(dst_type.scalar))
            if given and target and MANTISSA_BITS[target] < MANTISSA_BITS[given]:
                frame = sys._getframe(1)
                while frame is not None and frame.f_code.co_filename.startswith(triton_dir):
                    frame = frame.f_back
                line = "?" if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"
                key = (given, target, line)
                STATE.narrowed[key] = STATE.narrowed.get(key, 0) + 1
                result = cast(self, src, dst_type, *rest)
                result.attr[NARROWED_FROM] = key  # for _watch_stores
                return result
            return cast(self, src, dst_type, *rest)

        return narrowing_cast

    builder.create_fp_trunc = counted(builder.create_fp_trunc)
    builder.create_fp_to_fp = counted(builder.create_fp_to_fp)


NARROWED_FROM = "linattn_verify.narrowed"  # a TensorHandle.attr key: the cast that made it


@dataclass
class _Stores:
    """What _watch_stores keeps: the launches so far, the current one's tensors (start and end
    address, argument name, the tensor), and per tensor written by a narrowed store (by its
    id) the cast's (from, to, line), the storing argument's label, the launch, the tensor
    (weakly: its memory is not another's while it lives), and the launches that read it."""

    launches: int = 0
    kernel: str = ""
    arguments: list[tuple[int, int, str, weakref.ref]] = field(default_factory=list)
    written: dict[int, list] = field(default_factory=dict)


_STORES = _Stores()


def _watch_stores(interpreter) -> None:
    """An instrument, not a fix: a store whose value a narrowing cast made (_watch_narrowing
    tags it) is remembered with the launch argument it writes into; a later launch that loads
    from that tensor counts it in STATE.stored (once a launch), by the storing line and
    argument: a value kept between kernels in the coarser precision."""
    launch = interpreter.GridExecutor.__call__
    builder = interpreter.InterpreterBuilder
    load, store = builder.create_masked_load, builder.create_masked_store

    def call(self, *args, **kwargs):
        _STORES.launches += 1
        _STORES.kernel, _STORES.arguments = self.fn.__name__, []
        written = _STORES.written  # the tensors still alive
        _STORES.written = {key: r for key, r in written.items() if r[3]() is not None}
        for name, arg in (*zip(self.arg_names, args), *kwargs.items()):
            if isinstance(arg, torch.Tensor) and arg.numel() and arg.is_floating_point():
                last = sum((n - 1) * abs(s) for n, s in zip(arg.shape, arg.stride()))
                end = arg.data_ptr() + (last + 1) * arg.element_size()
                _STORES.arguments.append((arg.data_ptr(), end, name, weakref.ref(arg)))
        return launch(self, *args, **kwargs)

    def argument(ptrs, mask):
        """The current launch's tensor the (unmasked) pointers point into, or None."""
        data = ptrs.data if mask is None else ptrs.data[np.broadcast_to(mask.data, ptrs.data.shape)]
        if not data.size or not _STORES.arguments:
            return None
        first = int(np.min(data))
        holding = [a for a in _STORES.arguments if a[0] <= first < a[1]]
        return min(holding, key=lambda a: a[1] - a[0]) if holding else None

    def masked_store(self, ptrs, value, mask, cache_policy):
        cast = value.attr.get(NARROWED_FROM)
        if cast is not None and (held := argument(ptrs, mask)) is not None:
            tensor = held[3]()
            if tensor is not None and id(tensor) not in _STORES.written:
                label = f"{_STORES.kernel}'s {held[2]}"
                _STORES.written[id(tensor)] = [cast, label, _STORES.launches, held[3], set()]
        return store(self, ptrs, value, mask, cache_policy)

    def masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        if _STORES.written and (held := argument(ptrs, mask)) is not None:
            tensor = held[3]()
            record = None if tensor is None else _STORES.written.get(id(tensor))
            later = record is not None and record[3]() is tensor and record[2] < _STORES.launches
            if later and _STORES.launches not in record[4]:
                record[4].add(_STORES.launches)
                key = (*record[0], record[1])
                STATE.stored[key] = STATE.stored.get(key, 0) + 1
        return load(self, ptrs, mask, other, cache_policy, is_volatile)

    interpreter.GridExecutor.__call__ = call
    builder.create_masked_load = masked_load
    builder.create_masked_store = masked_store


def _patch_once(interpreter) -> None:
    """Time, not values: each call of a @jit function from inside a kernel
    (InterpretedFunction.__call__) runs _patch_lang, which walks triton.language, tl.tensor,
    tl.math and tensor_descriptor_base (inspect.getmembers) to wrap their builtins for the
    interpreter, and drops the scope it returns, so nothing it sets is undone. Inside a launch
    (GridExecutor.__call__, whose own _patch_lang holds until the launch ends), a call whose
    function sees no triton.language module but ones already patched in this launch would find
    no builtin left to wrap and set the other patches to equal ones again: it is skipped. Any
    other runs as before (a module not yet patched; none at all, which _patch_lang asserts).
    interpreter._patch_lang.__wrapped__ is triton's."""
    patch_lang, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    tl = interpreter.tl
    launches: list[list] = []  # per launch in progress: its kernel, and the modules patched

    def patched_modules(fn) -> set[int]:
        return {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}

    def patch_once(fn):
        if not launches:
            return patch_lang(fn)
        kernel, done = launches[-1]
        modules = patched_modules(fn)
        if done is not None and modules and modules <= done:
            return None  # InterpretedFunction.__call__ drops what _patch_lang returns
        scope = patch_lang(fn)
        if fn is kernel and done is None:  # the launch's own
            launches[-1][1] = modules
        elif done is not None:  # its scope is dropped: what it patched stays patched
            done |= modules
        return scope

    def call(self, *args, **kwargs):
        launches.append([self.fn, None])
        try:
            return launch(self, *args, **kwargs)
        finally:
            launches.pop()

    patch_once.__wrapped__ = patch_lang
    interpreter._patch_lang = patch_once
    interpreter.GridExecutor.__call__ = call
