"""KernelBuilder: the few LLVM-IR building blocks every operator lowering uses.

A kernel is one function `i32 @symbol(ptr %args)`: `args` points to an array of
buffer pointers (the kernel's inputs, then its outputs), the calling
convention the graph executor uses. Buffers are dense, row-major and hold
their TensorType's dtype. The builder offers counted loops, row-major and
broadcasting index arithmetic (GEP on element types, never pointer integers),
float math with the fast-math flags we allow, and LLVM intrinsics.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import llvmlite.ir as ir

from pipeline.ir.graph import TensorType

I32 = ir.IntType(32)
I64 = ir.IntType(64)
F32 = ir.FloatType()
PTR = ir.PointerType()
# Reassociation lets LLVM vectorise reductions; contraction allows FMA. Both
# change rounding at the 1e-7 level, well inside validation tolerances. We do
# not allow nnan/ninf: models may legitimately carry inf through max/relu.
FAST = ("reassoc", "contract", "nsz")

LLVM_TYPES = {"float32": F32, "int64": I64, "int32": I32, "bool": ir.IntType(8)}


def row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


@dataclass
class Buffer:
    """One kernel argument: a pointer plus the static type of what it points to."""

    ptr: ir.Value
    type: TensorType

    @property
    def elem(self) -> ir.Type:
        return LLVM_TYPES[self.type.dtype]

    @property
    def strides(self) -> tuple[int, ...]:
        return row_major_strides(self.type.shape)


class KernelBuilder:
    """Builds one kernel function in `module`; see the module docstring."""

    def __init__(self, module: ir.Module, symbol: str, params: list[TensorType]):
        self.module = module
        fn = ir.Function(module, ir.FunctionType(I32, [PTR]), name=symbol)
        fn.args[0].name = "args"
        fn.args[0].add_attribute("noalias")
        self.function = fn
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))
        self.buffers = []
        for i, t in enumerate(params):
            slot = self.b.gep(fn.args[0], [self.i64(i)], source_etype=PTR, inbounds=True)
            self.buffers.append(Buffer(self.b.load(slot, typ=PTR, name=f"buf{i}"), t))

    def finish(self) -> None:
        self.b.ret(ir.Constant(I32, 0))

    # -- constants and integer index arithmetic --

    @staticmethod
    def i64(n: int) -> ir.Constant:
        return ir.Constant(I64, int(n))

    @staticmethod
    def f32(x: float) -> ir.Constant:
        return ir.Constant(F32, float(x))

    def idx(self, v) -> ir.Value:
        return self.i64(v) if isinstance(v, int) else v

    def add(self, a, b):
        if isinstance(a, int) and isinstance(b, int):
            return a + b
        return self.b.add(self.idx(a), self.idx(b))

    def mul(self, a, b):
        if isinstance(a, int) and isinstance(b, int):
            return a * b
        if isinstance(b, int) and b == 1:
            return self.idx(a)
        return self.b.mul(self.idx(a), self.idx(b))

    def dot(self, index, strides) -> ir.Value:
        """sum(index[d] * strides[d]) with zero strides skipped."""
        total = 0
        for i, s in zip(index, strides, strict=True):
            if s:
                total = self.add(total, self.mul(i, s))
        return self.idx(total)

    # -- loops --

    @contextmanager
    def loop(self, start, stop, name: str = "i"):
        """`for i in range(start, stop)`; yields the i64 induction variable."""
        b = self.b
        start, stop = self.idx(start), self.idx(stop)
        pre = b.block
        head = b.append_basic_block(f"{name}.head")
        body = b.append_basic_block(f"{name}.body")
        done = b.append_basic_block(f"{name}.exit")
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64, name=name)
        i.add_incoming(start, pre)
        b.cbranch(b.icmp_signed("<", i, stop), body, done)
        b.position_at_end(body)
        yield i
        i.add_incoming(b.add(i, self.i64(1), name=f"{name}.next"), b.block)
        b.branch(head)
        b.position_at_end(done)

    @contextmanager
    def nest(self, shape: tuple[int, ...], name: str = "d"):
        """Nested loops over every index of `shape`; yields the list of indices."""
        if not shape:
            yield []
            return
        with self.loop(0, shape[0], f"{name}{len(shape)}") as i, \
                self.nest(shape[1:], name) as rest:
            yield [i, *rest]

    # -- memory --

    def gep(self, buf: Buffer, offset) -> ir.Value:
        return self.b.gep(buf.ptr, [self.idx(offset)], source_etype=buf.elem, inbounds=True)

    def load(self, buf: Buffer, offset) -> ir.Value:
        return self.b.load(self.gep(buf, offset), typ=buf.elem)

    def store(self, buf: Buffer, offset, value) -> None:
        self.b.store(value, self.gep(buf, offset))

    def load_broadcast(self, buf: Buffer, index: list) -> ir.Value:
        """Load `buf` at the output `index` under numpy broadcasting rules."""
        shape = buf.type.shape
        lead = len(index) - len(shape)
        strides = [0 if d == 1 else s for d, s in zip(shape, buf.strides, strict=True)]
        return self.load(buf, self.dot(index[lead:], strides))

    def local(self, init: ir.Value) -> ir.Value:
        """A stack slot holding `init`, allocated in the entry block (an alloca
        inside a loop would grow the stack every iteration); mem2reg removes it."""
        with self.b.goto_block(self.function.entry_basic_block):
            slot = self.b.alloca(init.type)
        self.b.store(init, slot)
        return slot

    def get(self, slot: ir.Value) -> ir.Value:
        return self.b.load(slot, typ=slot.allocated_type)

    def set(self, slot: ir.Value, value: ir.Value) -> None:
        self.b.store(value, slot)

    # -- float math --

    def fadd(self, a, b):
        return self.b.fadd(a, b, flags=FAST)

    def fsub(self, a, b):
        return self.b.fsub(a, b, flags=FAST)

    def fmul(self, a, b):
        return self.b.fmul(a, b, flags=FAST)

    def fdiv(self, a, b):
        return self.b.fdiv(a, b, flags=FAST)

    def intrinsic(self, name: str, *args) -> ir.Value:
        """Call `llvm.<name>.f32` (maxnum, minnum, exp, sqrt, ...)."""
        full = f"llvm.{name}.f32"
        fn = self.module.globals.get(full)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(F32, [F32] * len(args)), name=full)
        return self.b.call(fn, list(args))

    def fmax(self, a, b):
        return self.intrinsic("maxnum", a, b)

    def fmin(self, a, b):
        return self.intrinsic("minnum", a, b)
