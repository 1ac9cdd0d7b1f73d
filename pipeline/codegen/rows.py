"""Render a kernel over symbolic rows (pipeline/lower/rows.py): the calling
convention `int32_t f(void **args, const int64_t *dims)`, dims[k] the value of the
spec's symbol s<k>.

A kernel with runtime dimensions inside (not over rows) is a body function whose
buffers end with the dims array (dsl/dims.py), called by render_dims_call.

The rows function multiplies the row prefix's symbols into a row count, then calls the
static kernel for the first of its row blocks (lower/rows.py row_blocks: ROW_BLOCKS,
128 rows first for matmul_nbits) on each whole block of that many, the next
size's on the whole blocks of the rest, and the last rows in one padded call
(PADDED_TAIL) or down to one row at a time, each argument
that has the rows advanced by its row's bytes (an argument without them, a weight,
is passed as it is). The static kernels are private functions of the same module,
rendered as any static kernel.

The whole blocks of the first size are split over the thread team when the rows'
estimated work is worth more than one thread (parallel_for's rule, MIN_WORK_PER_THREAD,
with the runtime row count): each thread takes the next block from a shared counter
and calls the static kernel on it (whose own parallel loop, if any, then runs on the
thread alone: pl_parallel takes one caller at a time). Called one block after another
on the kernel's thread, a 512-row dense layer ran single-threaded, or forked the team
once per 32 rows.
"""

from __future__ import annotations

from collections.abc import Callable

import llvmlite.ir as ir
import numpy as np

from pipeline.dsl.types import I32, I64, PTR
from pipeline.dsl.vector import ELEMENT_WORK, MIN_WORK_PER_THREAD, VOID, memcpy
from pipeline.ir.dims import substitute
from pipeline.ir.target import bare_metal_triple
from pipeline.lower.cost import kernel_flops
from pipeline.lower.kernel import KernelSpec
from pipeline.lower.rows import ROW_BLOCKS, at_rows, row_blocks, row_prefix

# The rows left after the whole blocks of this many go in one call of the smallest
# block size holding them, through stack copies padded to that size, when those
# copies take at most PAD_BYTES: a dense layer's block kernel reads its weights once
# per call, and 7 rows called as 4 + 1 + 1 + 1 read them four times (a 256-wide
# encoder at seq 7 took 1.5x onnxruntime).
PADDED_TAIL = 8
PAD_BYTES = 1 << 17

__all__ = ["render_dims_call", "render_rows"]


def _row_bytes(spec: KernelSpec, prefix: tuple[str, ...]) -> list[int]:
    """Bytes one row of each argument spans (0 for an argument without the rows)."""
    ones = dict.fromkeys(prefix, 1)
    return [int(np.prod(substitute(t.shape, ones), dtype=np.int64)) * np.dtype(t.dtype).itemsize
            if t.symbolic else 0 for t in spec.params]


def render_rows(module: ir.Module, spec: KernelSpec,
                body: Callable[[ir.Module, KernelSpec, str], ir.Function]) -> None:
    """Define `spec.symbol` in `module` (module doc); `body(module, spec, name)`
    renders a static kernel as function `name`."""
    prefix, blocks = row_prefix(spec), row_blocks(spec)
    inner = {}
    for rows in blocks:
        fn = body(module, at_rows(spec, prefix, rows), f"{spec.symbol}.rows{rows}")
        fn.linkage = "internal"
        inner[rows] = fn
    fn = ir.Function(module, ir.FunctionType(I32, [PTR, PTR]), name=spec.symbol)
    args, dims = fn.args
    args.name, dims.name = "args", "dims"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    n = len(spec.params)
    argv = b.alloca(PTR, size=ir.Constant(I64, n), name="argv")
    bases = [b.load(b.gep(args, [ir.Constant(I64, i)], source_etype=PTR), typ=PTR)
             for i in range(n)]
    rows = ir.Constant(I64, 1)
    for s in prefix:
        k = spec.symbols.index(s)
        rows = b.mul(rows, b.load(b.gep(dims, [ir.Constant(I64, k)], source_etype=I64),
                                  typ=I64))
    sizes = _row_bytes(spec, prefix)
    start = ir.Constant(I64, 0)
    for step in blocks:  # [start, stop): the whole blocks of `step` rows left
        block = ir.Constant(I64, step)
        stop = b.add(start, b.mul(b.udiv(b.sub(rows, start), block), block))
        if step == blocks[0] and not bare_metal_triple(module.triple):
            work = max(kernel_flops(at_rows(spec, prefix, 1)) // 2,
                       ELEMENT_WORK * sum(sizes) // 4)
            team = _team_blocks(module, spec.symbol, inner[step], step, sizes)
            _on_team(fn, b, team, b.udiv(stop, block), b.mul(rows, ir.Constant(I64, work)),
                     bases)
        else:
            _row_loop(fn, b, inner[step], step, start, stop, argv, bases, sizes)
        start = stop
        if step == PADDED_TAIL and PADDED_TAIL * sum(sizes) <= PAD_BYTES \
                and not bare_metal_triple(module.triple):  # memcpy: a hosted libc
            _padded_tail(fn, b, inner, start, b.sub(rows, start), argv, bases, sizes)
            break
    b.ret(ir.Constant(I32, 0))


def _padded_tail(fn: ir.Function, b: ir.IRBuilder, inner: dict, start, rest, argv,
                 bases: list, sizes: list[int]) -> None:
    """The last `rest` rows (fewer than PADDED_TAIL) from `start` in one call: one row
    as it is, more through stack copies of the rows padded to the next block size
    (the pad rows repeat the first, so they hold valid values: token ids, say);
    the output's valid rows are copied back."""
    with b.goto_entry_block():
        scratch = [b.alloca(ir.IntType(8), size=ir.Constant(I64, PADDED_TAIL * size))
                   if size else None for size in sizes]
    low = 1
    for step in sorted(s for s in ROW_BLOCKS if s <= PADDED_TAIL):  # rest in low..step
        taken = b.and_(b.icmp_signed(">=", rest, ir.Constant(I64, low)),
                       b.icmp_signed("<=", rest, ir.Constant(I64, step)))
        with b.if_then(taken):
            _padded_call(b, inner[step], step, start, rest, argv, bases, sizes,
                         scratch)
        low = step + 1


def _padded_call(b: ir.IRBuilder, kernel: ir.Function, step: int, start, rest,
                 argv, bases: list, sizes: list[int], scratch: list) -> None:
    """kernel(step rows) on rows start.. start + rest (rest <= step) through scratch."""

    def at(ptr, offset):
        return b.gep(ptr, [offset], source_etype=ir.IntType(8))

    last = len(sizes) - 1
    for i, (base, size, buf) in enumerate(zip(bases, sizes, scratch, strict=True)):
        row = ir.Constant(I64, size)
        ptr = base if not size else (at(base, b.mul(start, row)) if step == 1 else buf)
        if size and step > 1 and i < last:
            memcpy(b, buf, at(base, b.mul(start, row)), b.mul(rest, row))
            for r in range(1, step):
                with b.if_then(b.icmp_signed("<=", rest, ir.Constant(I64, r))):
                    memcpy(b, at(buf, ir.Constant(I64, r * size)), buf, row)
        b.store(ptr, b.gep(argv, [ir.Constant(I64, i)], source_etype=PTR))
    rc = b.call(kernel, [argv])
    with b.if_then(b.icmp_signed("!=", rc, ir.Constant(I32, 0)), likely=False):
        b.ret(rc)
    if step > 1:
        row = ir.Constant(I64, sizes[last])
        memcpy(b, at(bases[last], b.mul(start, row)), scratch[last], b.mul(rest, row))


def _team_blocks(module: ir.Module, symbol: str, kernel: ir.Function, step: int,
                 sizes: list[int]) -> ir.Function:
    """`void <symbol>.team(ptr data)`, run by every thread of the team: data holds the
    argument bases, the next block's counter, the block count and the first error
    code; each thread claims blocks of `step` rows until none is left."""
    fn = ir.Function(module, ir.FunctionType(VOID, [PTR]), name=f"{symbol}.team")
    fn.linkage = "internal"
    data = fn.args[0]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    argv = b.alloca(PTR, size=ir.Constant(I64, len(sizes)), name="argv")
    bases_ptr = b.load(b.gep(data, [ir.Constant(I64, 0)], source_etype=PTR), typ=PTR)
    bases = [b.load(b.gep(bases_ptr, [ir.Constant(I64, i)], source_etype=PTR), typ=PTR)
             for i in range(len(sizes))]
    counter, count, error = (b.gep(data, [ir.Constant(I64, k)], source_etype=I64)
                             for k in (1, 2, 3))
    n = b.load(count, typ=I64)
    head, body, done = (fn.append_basic_block(x) for x in ("claim", "run", "done"))
    b.branch(head)
    b.position_at_end(head)
    blk = b.atomic_rmw("add", counter, ir.Constant(I64, 1), "monotonic")
    b.cbranch(b.icmp_signed("<", blk, n), body, done)
    b.position_at_end(body)
    r = b.mul(blk, ir.Constant(I64, step))
    for i, (base, size) in enumerate(zip(bases, sizes, strict=True)):
        ptr = (b.gep(base, [b.mul(r, ir.Constant(I64, size))], source_etype=ir.IntType(8))
               if size else base)
        b.store(ptr, b.gep(argv, [ir.Constant(I64, i)], source_etype=PTR))
    rc = b.call(kernel, [argv])
    with b.if_then(b.icmp_signed("!=", rc, ir.Constant(I32, 0))):
        b.atomic_rmw("xchg", error, b.sext(rc, I64), "monotonic")
    b.branch(head)
    b.position_at_end(done)
    b.ret_void()
    return fn


def _declare(module: ir.Module, name: str, ret: ir.Type, args: list) -> ir.Function:
    fn = module.globals.get(name)
    return fn if fn is not None else ir.Function(module, ir.FunctionType(ret, args), name=name)


def _on_team(fn: ir.Function, b: ir.IRBuilder, team: ir.Function, blocks, work,
             bases: list) -> None:
    """Run `team` over `blocks` blocks on min(threads, blocks, work's worth) threads
    (pl_parallel; directly when that is one, or without the executor's team); return
    its error code if a block failed."""
    with b.goto_entry_block():
        data = b.alloca(PTR, size=ir.Constant(I64, 4), name="team")  # 8-byte slots
        table = b.alloca(PTR, size=ir.Constant(I64, len(bases)), name="bases")
    for i, base in enumerate(bases):
        b.store(base, b.gep(table, [ir.Constant(I64, i)], source_etype=PTR))
    b.store(table, data)
    for k, value in ((1, ir.Constant(I64, 0)), (2, blocks), (3, ir.Constant(I64, 0))):
        b.store(value, b.gep(data, [ir.Constant(I64, k)], source_etype=I64))
    threads = b.sext(b.call(_declare(fn.module, "omp_get_max_threads", I32, []), []), I64)
    for limit in (blocks, b.udiv(work, ir.Constant(I64, MIN_WORK_PER_THREAD))):
        threads = b.select(b.icmp_signed("<", limit, threads), limit, threads)
    own = _declare(fn.module, "pl_parallel", VOID, [PTR, PTR, I32])
    own.linkage = "extern_weak"
    shared = b.and_(b.icmp_signed(">", threads, ir.Constant(I64, 1)),
                    b.icmp_unsigned("!=", own, ir.Constant(PTR, None)))
    with b.if_else(shared) as (then, otherwise):
        with then:
            b.call(own, [team, data, b.trunc(threads, I32)])
        with otherwise:
            b.call(team, [data])
    rc = b.load(b.gep(data, [ir.Constant(I64, 3)], source_etype=I64), typ=I64)
    with b.if_then(b.icmp_signed("!=", rc, ir.Constant(I64, 0)), likely=False):
        b.ret(b.trunc(rc, I32))


def _row_loop(fn: ir.Function, b: ir.IRBuilder, kernel: ir.Function, step: int, start,
              stop, argv, bases: list, sizes: list[int]) -> None:
    """for (r = start; r < stop; r += step) { argv = bases + r rows; rc = kernel(argv);
    if (rc) return rc; }"""
    pre = b.block
    head = fn.append_basic_block(f"rows{step}.head")
    body = fn.append_basic_block(f"rows{step}.body")
    failed = fn.append_basic_block(f"rows{step}.fail")
    done = fn.append_basic_block(f"rows{step}.exit")
    b.branch(head)
    b.position_at_end(head)
    r = b.phi(I64, name=f"r{step}")
    r.add_incoming(start, pre)
    b.cbranch(b.icmp_signed("<", r, stop), body, done)
    b.position_at_end(body)
    for i, (base, size) in enumerate(zip(bases, sizes, strict=True)):
        ptr = (b.gep(base, [b.mul(r, ir.Constant(I64, size))], source_etype=ir.IntType(8))
               if size else base)
        b.store(ptr, b.gep(argv, [ir.Constant(I64, i)], source_etype=PTR))
    rc = b.call(kernel, [argv])
    nxt = b.add(r, ir.Constant(I64, step))
    r.add_incoming(nxt, body)
    b.cbranch(b.icmp_signed("!=", rc, ir.Constant(I32, 0)), failed, head)
    b.position_at_end(failed)
    b.ret(rc)
    b.position_at_end(done)


def render_dims_call(module: ir.Module, spec: KernelSpec, body: ir.Function) -> None:
    """Define `spec.symbol(args, dims)` calling `body` (a kernel with runtime dimensions
    inside, dsl/dims.py) with its buffers and the dims array as one more buffer."""
    fn = ir.Function(module, ir.FunctionType(I32, [PTR, PTR]), name=spec.symbol)
    args, dims = fn.args
    args.name, dims.name = "args", "dims"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    n = len(spec.params)
    argv = b.alloca(PTR, size=ir.Constant(I64, n + 1), name="argv")
    for i in range(n):
        ptr = b.load(b.gep(args, [ir.Constant(I64, i)], source_etype=PTR), typ=PTR)
        b.store(ptr, b.gep(argv, [ir.Constant(I64, i)], source_etype=PTR))
    b.store(dims, b.gep(argv, [ir.Constant(I64, n)], source_etype=PTR))
    b.ret(b.call(body, [argv]))
