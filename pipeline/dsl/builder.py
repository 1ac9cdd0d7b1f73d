"""KernelBuilder: the few LLVM-IR building blocks every operator lowering uses.

A kernel is one function `i32 @symbol(ptr %args)`: `args` points to an array of buffer
pointers (the kernel's inputs, then its outputs), the graph executor's calling
convention. Buffers are dense, row-major and hold their TensorType's dtype. The
builder offers counted loops, row-major and broadcasting index arithmetic (GEP on
element types, never pointer integers), fast-math float math, LLVM intrinsics.

Index values (loop variables, `i64`, `index`) carry their own operators, so
offsets read as arithmetic: `kb.load(x, (n * c + ic) * plane + p)` (dsl/index.py);
data values stay llvmlite values and go through the methods here (fadd, select...).
"""

from __future__ import annotations

from contextlib import contextmanager

import llvmlite.ir as ir

from pipeline.dsl.dims import runtime_shapes
from pipeline.dsl.fastmath import exp_f32
from pipeline.dsl.index import Index, raw
from pipeline.dsl.minifloat import decode, encode
from pipeline.dsl.nibbles import SUB_BYTE, load4, store4, vload4, vstore4, widen4
from pipeline.dsl.types import (
    _SIGNED,
    F32,
    F64,
    FAST,
    FLOATS,
    HALF,
    I8,
    I32,
    I64,
    LLVM_TYPES,
    MINIFLOATS,
    NARROW,
    PTR,
    STORAGE_TYPES,
    Buffer,
    _align,
)
from pipeline.ir.graph import TensorType


class KernelBuilder:
    """Builds one kernel function in `module`; see the module docstring."""

    def __init__(self, module: ir.Module, symbol: str, params: list[TensorType],
                 symbols: tuple[str, ...] = ()):
        """symbols (KernelSpec.symbols): args end with the dims; shapes: dsl/dims.py."""
        self.module = module
        fn = ir.Function(module, ir.FunctionType(I32, [PTR]), name=symbol)
        fn.args[0].name = "args"
        fn.args[0].add_attribute("noalias")
        self.function = fn
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))
        if symbols:
            params = runtime_shapes(self, params, symbols)
        self.buffers = []
        for i, t in enumerate(params):
            slot = self.b.gep(fn.args[0], [raw(i)], source_etype=PTR, inbounds=True)
            self.buffers.append(Buffer(self.b.load(slot, typ=PTR, name=f"buf{i}"), t))

    def finish(self) -> None:
        self.b.ret(ir.Constant(I32, 0))

    # -- constants and integer indices --

    def i64(self, n: int) -> Index:
        """The constant `n` as an Index (where an llvmlite i64 value is needed)."""
        return Index(self, ir.Constant(I64, int(n)))

    @staticmethod
    def f32(x: float) -> ir.Constant:
        return ir.Constant(F32, float(x))

    def index(self, v):
        """`v` as an index: an int stays an int, an Index stays one, an llvmlite
        integer value (a loaded int32/int64 index, an i64 slot's value) becomes an
        Index, sign-extended to i64."""
        if isinstance(v, int | Index):
            return v
        if v.type != I64:
            v = self.b.sext(v, I64)
        return Index(self, v)

    def dot(self, index, strides):
        """sum(index[d] * strides[d]) with zero strides skipped (an int if all are)."""
        total = 0
        for i, s in zip(index, strides, strict=True):
            if s:
                total = total + self.index(i) * s
        return total

    def unflatten(self, flat: Index, shape) -> list:
        """The row-major index of element `flat` (< prod(shape)) in `shape`: dot's inverse."""
        if not shape:
            return []
        index = []
        for size in reversed(shape[1:]):
            index.append(flat % size)
            flat = flat // size
        return [flat, *reversed(index)]

    def smax(self, a, b) -> Index:  # the signed maximum of two indices
        return self.index(self.select(self.index(a) > b, a, b))

    def smin(self, a, b) -> Index:  # the signed minimum
        return self.index(self.select(self.index(a) < b, a, b))

    def clamp(self, v: Index | int, size: int) -> Index | int:
        """`v` clamped into [0, size); `v` may have folded to a Python int."""
        if isinstance(v, int):
            return min(max(v, 0), size - 1)
        low = self.select(v < 0, 0, v)
        return self.select(self.index(low) >= size, size - 1, low)

    def below(self, v: Index | int, n) -> ir.Value:
        """i1: 0 <= v < n as one unsigned compare; `v` may have folded to a Python int."""
        return (v if isinstance(v, Index) else self.i64(v)).below(n)

    def inside(self, v: Index | int, lo: int, hi: int) -> ir.Value:
        """i1: lo <= v < hi; `v` may have folded to a Python int (a 1-high output)."""
        v = v if isinstance(v, Index) else self.i64(v)
        return self.and_(v >= lo, v < hi)

    def checked_index(self, k, dim: int) -> Index:
        """A loaded index (int32/int64) as an i64 Index in [0, dim): negative ones count
        from the end; anything outside makes the kernel fail (ONNX Gather, Scatter...)."""
        k = self.index(k)
        k = self.select(k < 0, k + dim, k)
        self.fail_unless(self.inside(k, 0, dim))
        return k

    # -- loops --

    @contextmanager
    def loop(self, start, stop, name: str = "i"):
        """`for i in range(start, stop)`; yields the induction variable, an Index."""
        b = self.b
        start, stop = raw(start), raw(stop)
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
        yield Index(self, i)
        i.add_incoming(b.add(i, ir.Constant(I64, 1), name=f"{name}.next"), b.block)
        b.branch(head)
        b.position_at_end(done)

    @contextmanager
    def if_(self, flag: ir.Value):
        """Code generated in the block runs only when the i1 `flag` holds."""
        with self.b.if_then(flag):
            yield

    def fail_unless(self, ok: ir.Value) -> None:
        """Return error code 1 from the kernel unless `ok` (an i1) holds."""
        fail = self.function.append_basic_block("fail")
        cont = self.function.append_basic_block("ok")
        self.b.cbranch(ok, cont, fail)
        with self.b.goto_block(fail):
            self.b.ret(ir.Constant(I32, 1))
        self.b.position_at_end(cont)

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

    def gep(self, buf: Buffer, offset, inbounds: bool = True) -> ir.Value:
        return self.b.gep(buf.ptr, [raw(offset)], source_etype=buf.storage, inbounds=inbounds)

    def load(self, buf: Buffer, offset) -> ir.Value:
        """buf[offset], in the buffer's compute type (`Buffer.elem`)."""
        if buf.type.dtype in SUB_BYTE:
            return load4(self, buf, offset)
        return self.widen(self.b.load(self.gep(buf, offset), typ=buf.storage),
                          buf.type.dtype)

    def store(self, buf: Buffer, offset, value) -> None:
        """buf[offset] = value (a value of the compute type, narrowed to storage)."""
        value = raw(value)
        if buf.type.dtype in SUB_BYTE:
            return store4(self, buf, offset, value)
        if buf.type.dtype in NARROW:
            value = self._to_storage(value, buf.storage, buf.type.dtype)
        self.b.store(value, self.gep(buf, offset))

    def vload(self, buf: Buffer, offset, n: int) -> ir.Value:
        """`n` consecutive elements of `buf` from `offset` as a vector of the compute
        type (aligned to one element)."""
        if buf.type.dtype in SUB_BYTE:
            return vload4(self, buf, offset, n)
        typ = ir.VectorType(buf.storage, n)
        return self.widen(self.b.load(self.gep(buf, offset), typ=typ,
                                      align=_align(buf.storage)), buf.type.dtype)

    def vstore(self, buf: Buffer, offset, value: ir.Value) -> None:
        if buf.type.dtype in SUB_BYTE:
            return vstore4(self, buf, offset, value)
        if buf.type.dtype in NARROW:
            value = self._to_storage(value, ir.VectorType(buf.storage, value.type.count),
                                     buf.type.dtype)
        self.b.store(value, self.gep(buf, offset), align=_align(buf.storage))

    def widen(self, v: ir.Value, dtype: str) -> ir.Value:
        """A value (scalar or vector) of `dtype`'s storage type in its compute type: half,
        bfloat16, float8 -> float (exact), int8/int16 sign-, unsigned zero-extended."""
        if dtype in MINIFLOATS or dtype in SUB_BYTE or dtype not in NARROW:
            return decode(self, v, dtype) if dtype in MINIFLOATS else \
                widen4(self, v, dtype) if dtype in SUB_BYTE else v
        to = LLVM_TYPES[dtype]
        if isinstance(v.type, ir.VectorType):
            to = ir.VectorType(to, v.type.count)
        if dtype == "float16":
            return self.b.fpext(v, to)
        return (self.b.sext if dtype in _SIGNED else self.b.zext)(v, to)

    def _to_storage(self, v: ir.Value, to: ir.Type, dtype: str, saturate: bool = False):
        """A `dtype` compute value as storage type `to` (floats round to even, ints wrap)."""
        if dtype in MINIFLOATS or v.type == to:
            return encode(self, v, dtype, saturate) if dtype in MINIFLOATS else v
        elem = v.type.element if isinstance(v.type, ir.VectorType) else v.type
        return self.b.fptrunc(v, to) if isinstance(elem, ir.FloatType | ir.DoubleType) \
            else self.b.trunc(v, to)

    def bitcast(self, v, source: str, dtype: str) -> ir.Value:
        """The bits of `v` (a value of dtype `source`, in its compute type) read as
        `dtype` (same storage width), in `dtype`'s compute type: ONNX BitCast."""
        v = raw(v)
        if source in NARROW:
            v = self._to_storage(v, STORAGE_TYPES[source], source)
        return self.widen(self.b.bitcast(v, STORAGE_TYPES[dtype]), dtype)

    def narrow(self, v, dtype: str, saturate: bool = False) -> ir.Value:
        """A computed value rounded to what `dtype` can hold, in the compute type (half
        to nearest even, ints wrap; other dtypes as they are). Applied after each fused
        op, so a chain gives what the ops one by one would (exact for half +-*/sqrt)."""
        v = raw(v)
        if dtype not in NARROW:
            return v
        store = STORAGE_TYPES[dtype]
        if isinstance(v.type, ir.VectorType):
            store = ir.VectorType(store, v.type.count)
        return self.widen(self._to_storage(v, store, dtype, saturate), dtype)

    def splat(self, scalar: ir.Value, n: int) -> ir.Value:
        """The vector with every lane `scalar` (LLVM folds this into a broadcast load)."""
        t = ir.VectorType(scalar.type, n)
        one = self.b.insert_element(ir.Constant(t, None), scalar, ir.Constant(I32, 0))
        # an all-zeros mask, written as zeroinitializer (n "i32 0"s cost render time)
        return self.b.shuffle_vector(one, ir.Constant(t, None),
                                     ir.Constant(ir.VectorType(I32, n), None))

    def lane(self, v: ir.Value, k: int) -> ir.Value:  # lane k of the vector v
        return self.b.extract_element(v, ir.Constant(I32, k))

    def with_lane(self, v: ir.Value, k: int, x: ir.Value) -> ir.Value:  # v, lane k = x
        return self.b.insert_element(v, x, ir.Constant(I32, k))

    def load_broadcast(self, buf: Buffer, index: list, lanes: int | None = None) -> ir.Value:
        """Load `buf` at the output `index` under numpy broadcasting: a scalar, or with
        `lanes` an n-lane vector along the last output dimension (index[-1] the first
        lane): a vector load when buf varies along it, else its element splat."""
        shape = buf.type.shape
        lead = len(index) - len(shape)
        strides = [0 if d == 1 else s for d, s in zip(shape, buf.strides, strict=True)]
        offset = self.dot(index[lead:], strides)
        if lanes is None:
            return self.load(buf, offset)
        if shape and shape[-1] != 1:
            return self.vload(buf, offset, lanes)
        return self.splat(self.load(buf, offset), lanes)

    def local(self, init) -> ir.Value:
        """A stack slot holding `init`, allocated in the entry block (an alloca
        inside a loop would grow the stack every iteration); mem2reg removes it."""
        init = raw(init)
        slot = self._alloca(init.type)
        self.b.store(init, slot)
        return slot

    def scratch(self, size: int, dtype: str = "float32") -> Buffer:
        """An array of `size` `dtype` elements on the stack (entry block): temporaries."""
        return Buffer(self._alloca(STORAGE_TYPES[dtype], raw(size)),
                      TensorType((size,), dtype))

    def _alloca(self, typ: ir.Type, count=None) -> ir.Value:
        """An alloca in the entry block whose pointer is opaque like every other
        (llvmlite types it `typ*`, which the IR text would then show)."""
        with self.b.goto_block(self.function.entry_basic_block):
            slot = self.b.alloca(typ, size=count)
        slot.type = PTR
        return slot

    def get(self, slot: ir.Value) -> ir.Value:  # the value in a local() slot
        return self.b.load(slot, typ=slot.allocated_type)

    def set(self, slot: ir.Value, value) -> None:  # store into a local() slot
        self.b.store(raw(value), slot)

    # -- float math (fast=False: plain IEEE, where a kernel needs exact signs) --

    def fadd(self, a, b, fast: bool = True):
        return self.b.fadd(a, b, flags=FAST if fast else ())

    def fsub(self, a, b, fast: bool = True):
        return self.b.fsub(a, b, flags=FAST if fast else ())

    def fmul(self, a, b, fast: bool = True):
        return self.b.fmul(a, b, flags=FAST if fast else ())

    def fdiv(self, a, b, fast: bool = True):
        return self.b.fdiv(a, b, flags=FAST if fast else ())

    def intrinsic(self, name: str, *args) -> ir.Value:
        """Call `llvm.<name>.<type>` (maxnum, fma, exp, sqrt, ...) on f32/f64 scalars or
        vectors (v8f32, ...), the type of the first argument (all arguments share it)."""
        typ = args[0].type
        elem = typ.element if isinstance(typ, ir.VectorType) else typ
        bits = "f64" if elem == F64 else "f32"
        suffix = f"v{typ.count}{bits}" if isinstance(typ, ir.VectorType) else bits
        full = f"llvm.{name}.{suffix}"
        fn = self.module.globals.get(full)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(typ, [typ] * len(args)), name=full)
        return self.b.call(fn, list(args))

    # Scalar max/min are IEEE 754-2019 maximumNumber/minimumNumber: a NaN operand
    # is ignored, as with maxnum, and -0 < +0. Not maxnum: LLVM 22 vectorises a
    # loop-carried maxnum reduction with NaN checks whose two cost models disagree
    # on znver4/znver5 for some trip counts (121 aborts, 120 not), and its
    # assertion aborts the process; maximumnum reductions take another path.
    def fmax(self, a, b):
        return self.intrinsic("maximumnum", a, b)

    def fmin(self, a, b):
        return self.intrinsic("minimumnum", a, b)

    def exp(self, x):
        """exp(x): float32 in arithmetic that vectorises (fastmath.exp_f32), else llvm.exp."""
        if x.type == F64:
            return self.intrinsic("exp", x)
        return exp_f32(self, x)

    # -- dtype-aware scalar math (float32/64, int64/int32, bool as i8 0/1) --

    @staticmethod
    def const(value, typ: ir.Type) -> ir.Constant:
        """`value` as a constant of LLVM type `typ` (F32, F64 or an integer type)."""
        return ir.Constant(typ, float(value) if typ in FLOATS else int(value))

    @staticmethod
    def fconst(value: float, like: ir.Value) -> ir.Constant:
        """The float constant `value` of the type of `like` (a splat for a vector)."""
        if isinstance(like.type, ir.VectorType):
            return ir.Constant(like.type, [float(value)] * like.type.count)
        return ir.Constant(like.type, float(value))

    def arith(self, op: str, a, b, fast: bool = True, unsigned: bool = False):
        """add, sub, mul, div, rem, min, max of two values of one type: float (with
        the fast-math flags unless not `fast`; rem never has them) or integer, signed
        (div and rem truncate toward zero, as C and onnxruntime do) or `unsigned`."""
        a, b = raw(a), raw(b)
        if a.type in FLOATS:
            if op == "rem":
                return self.b.frem(a, b)
            if op in ("min", "max"):
                return (self.fmin if op == "min" else self.fmax)(a, b)
            return {"add": self.fadd, "sub": self.fsub, "mul": self.fmul,
                    "div": self.fdiv}[op](a, b, fast=fast)
        if op in ("min", "max"):
            return self.select(self.compare("<" if op == "min" else ">", a, b,
                                            unsigned=unsigned), a, b)
        return {"add": self.b.add, "sub": self.b.sub, "mul": self.b.mul,
                "div": self.b.udiv if unsigned else self.b.sdiv,
                "rem": self.b.urem if unsigned else self.b.srem}[op](a, b)

    def compare(self, op: str, a, b, ordered: bool = False, unsigned: bool = False):
        """i1 of `a op b` for op in ==, !=, <, <=, >, >= (integers signed unless `unsigned`;
        floats ordered: NaN is false, except != which NaN makes true unless `ordered`)."""
        a, b = raw(a), raw(b)
        elem = a.type.element if isinstance(a.type, ir.VectorType) else a.type
        if elem in FLOATS:  # lane-wise on vectors
            return self.b.fcmp_ordered(op, a, b) if op != "!=" or ordered else \
                self.b.fcmp_unordered(op, a, b)
        return (self.b.icmp_unsigned if unsigned else self.b.icmp_signed)(op, a, b)

    def isnan(self, x: ir.Value) -> ir.Value:
        """i1: the float x is NaN."""
        return self.b.fcmp_unordered("uno", x, x)

    def select(self, flag: ir.Value, a, b):
        """`a` if the i1 `flag` holds, else `b`; an Index when a or b is an index
        (an Index or an int), else an llvmlite value."""
        value = self.b.select(flag, raw(a), raw(b))
        return Index(self, value) if isinstance(a, int | Index) or isinstance(b, int | Index) \
            else value

    # Bitwise on integers and i1 flags (bool tensors hold 0/1, so these are logical).
    def and_(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.and_(a, b)

    def or_(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.or_(a, b)

    def xor(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.xor(a, b)

    def neg(self, x: ir.Value) -> ir.Value:
        """-x of a float (fneg) or an integer (0 - x)."""
        return self.b.fneg(x) if x.type in FLOATS else self.b.neg(x)

    def truth(self, v) -> ir.Value:
        """i1: v is non-zero (NaN counts as true, as in a C cast to bool)."""
        return self.compare("!=", v, self.const(0, v.type))

    def as_bool(self, flag) -> ir.Value:
        """An i1 as the stored bool type (i8 0/1)."""
        return self.b.zext(flag, LLVM_TYPES["bool"])

    def as_index(self, flag) -> Index:
        """An i1 as the index 0 or 1."""
        return Index(self, self.b.zext(flag, I64))

    def cast(self, v, dtype: str | ir.Type, saturate: bool = True,
             unsigned: bool = False) -> ir.Value:
        """`v` (in its compute type; uint64 if `unsigned`) as `dtype` (a name or an LLVM
        type; i8 is bool) with ONNX Cast semantics (float -> int truncates toward zero; to
        float16, bfloat16, float8 rounds to nearest even, float8 saturating unless not
        `saturate`; to narrow ints keeps the low bits), in `dtype`'s compute type."""
        if isinstance(dtype, ir.Type):
            dtype = next(k for k, t in LLVM_TYPES.items() if t == dtype)
        v = raw(v)
        to = LLVM_TYPES[dtype]
        if dtype == "bool":
            return self.as_bool(self.truth(v))
        if dtype in MINIFLOATS:
            return self.narrow(self.cast(v, "float32", unsigned=unsigned), dtype, saturate)
        if dtype == "float16":  # one rounding, from whatever precision v has
            if v.type in FLOATS:
                half = self.b.fptrunc(v, HALF)
            else:
                half = (self.b.uitofp if v.type == I8 or unsigned else self.b.sitofp)(v, HALF)
            return self.widen(half, dtype)
        if dtype in NARROW:  # narrow ints: through i64 (a float beyond i32 is no poison)
            wide = self.cast(v, "int64") if v.type != I32 else v
            return self.narrow(wide, dtype)
        if v.type == to:
            return v
        if v.type in FLOATS:
            if to == F64:
                return self.b.fpext(v, to)
            return self.b.fptrunc(v, to) if to == F32 else \
                (self.b.fptoui if dtype == "uint64" else self.b.fptosi)(v, to)
        bool_in = v.type == LLVM_TYPES["bool"]  # 0/1, never sign-extended
        if to in FLOATS:
            return self.b.uitofp(v, to) if bool_in or unsigned else self.b.sitofp(v, to)
        if v.type.width > to.width:
            return self.b.trunc(v, to)
        return self.b.zext(v, to) if bool_in else self.b.sext(v, to)

    def extern(self, name: str, *args) -> ir.Value:
        """Call the C math library's float function `name` (erff, tanhf, log1pf...);
        on float64 arguments its double twin (the name without the final f)."""
        typ = args[0].type
        if typ == F64:
            name = name.removesuffix("f")
        fn = self.module.globals.get(name) or \
            ir.Function(self.module, ir.FunctionType(typ, [typ] * len(args)), name=name)
        return self.b.call(fn, list(args))

    def table(self, values, typ: ir.Type = I64) -> ir.GlobalVariable:
        """A private constant array of `values` (a build-time index map), for load_table."""
        array = ir.ArrayType(typ, len(values))
        g = ir.GlobalVariable(self.module, array, self.module.get_unique_name("table"))
        g.global_constant, g.linkage = True, "private"
        g.initializer = ir.Constant(array, [self.const(v, typ) for v in values])
        return g

    def load_table(self, table: ir.GlobalVariable, i):
        """table[i]: an Index from an i64 table, else an llvmlite value."""
        ptr = self.b.gep(table, [raw(0), raw(i)], source_etype=table.value_type, inbounds=True)
        value = self.b.load(ptr, typ=table.value_type.element)
        return Index(self, value) if value.type == I64 else value
