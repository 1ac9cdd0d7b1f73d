"""matmul_nbits's lowering: int8 activations in the cols16x4 layout, else the float32
kernels of kernels/nbits.py.

accuracy=4 is onnxruntime's accuracy_level 4 (its MLAS "CompInt8"): `a` is quantized
to int8 per block of K and the products are summed in integer. AlterOpLayout gives
the cols16x4 layout (ops/nbits.py) on a target with AVX-512 VNNI (qconv_blocked.
dot_kind "vnni", 16 lanes) to constant 4-bit weights with zero points packed or
absent: at accuracy 4 for any K and N (N padded to whole groups of 16), at other
levels where K is whole blocks and N whole groups. Every other matmul_nbits (8 bits,
float zero points, no VNNI, opt level below 3) is computed in float32 by nbits.py.

The other levels (0, unset, is onnxruntime's default and float32 there) keep
float32's accuracy on the same kernel: `a` goes in three int8 parts per block, each
the rounding of what the parts before it left, at STEPS times finer a step, so the
parts' sum is `a` to within half of the last step, ~max |a| / 127 / 254^2 / 2 (2^-24
of the block's largest value, float32's own rounding of it); three vpdpbusd per
weight vector and row where accuracy 4 does one. That is for fewer than GEMM_ROWS
rows (a decode step: bound by the weights' bytes, 1.96 -> 1.25 ms on the benchmark
decoder against the float path); more rows (a prefill: bound by compute) take the
float kernel's blocked form, dequantizing this layout.

Per call, before the columns are split over the threads, the rows of `a` are
quantized (_quantize_rows) into stack buffers the work items share: per row and block,
scale = max |a| / 127 and q = roundeven(a * 127 / max |a|) (0 for a block of zeros),
as onnxruntime's MLAS does, then for more parts the residual's q at scale / STEPS,
..., stored with each run of 8 values as its 4 even ones, then its 4 odd ones, the
parts' scales and the block's sum (of the values the parts make) beside;
a last partial block (K not a multiple of the block) is padded with zeros, so the
weights' padding meets zeros. A row's int8 values take QUANT_BYTES at most: more rows
go in chunks, each quantized, then multiplied (a prefill's weights are read once per
chunk).

A work item is a group of 16 columns; its rows go R at a time. Per block, each 64
bytes of weights (4 bytes, 8 values, of each of the 16 columns: cols16x4) are two u8
vectors, the low nibbles (the columns' even values) and the high ones (the odd), each
meeting 4 bytes of a row's int8 values (per part) broadcast in one vpdpbusd (dot():
lane j, the sum of 4 products of column j), so per 128 weights: one load, three
operations, and 2 vpdpbusd per row and part, where the float kernel unpacks,
converts and FMAs every weight. A row's block sums d (int32, per column) then meet
the zero point through the row's block sum, sum((w - z) a) = sum_p s_p d_p - z *
sum(a), which times the weights' scales goes in one FMA into the row's float
accumulator; no lane sums: the 16 lanes are the 16 columns' outputs, biased and
finished as one vector (store_lanes; a last group past N: lane by lane).
"""

from __future__ import annotations

import llvmlite.ir as ir

from pipeline.dsl.builder import F32, I32
from pipeline.dsl.vector import fma, parallel_for, prefetch, reduce_lanes, vconst, vmax, zeros
from pipeline.kernels.nbits import (
    LANES,
    ROWS,
    blocked_width,
    cols_zero_points,
    lower_float,
    store_lanes,
    tree,
)
from pipeline.kernels.qconv_blocked import broadcast, dot
from pipeline.kernels.registry import lowering

I8 = ir.IntType(8)
QUANT_BYTES = 512 << 10  # the most stack the quantized rows of `a` take
STEPS = 254  # each int8 part after the first resolves its predecessor's step this finely
# How far ahead of its loads the three-part kernel prefetches its weights: as much
# compute as memory time per byte, the hardware prefetcher alone left the core waiting
# (a 48 MB chain of 4-bit layers: 0.89-0.98 of the time without, 7 same-process A/Bs).
PREFETCH_BYTES = 512
# A run of 16 int8 values as two runs of 8, each its even values, then its odd ones
# (the order of a 4-byte run's low nibbles, then its high ones).
_EVENS_FIRST = [base + k for base in (0, 8) for k in (0, 2, 4, 6, 1, 3, 5, 7)]


def _quantize_block(kb, src, at, block: int, scratch, slot, parts: int) -> None:
    """The `block` floats of `src` from `at` as `parts` int8 parts (module doc) into
    qa (part p's bytes from (slot * parts + p) * block, 8-value runs evens first)
    and their scales into qs (floats from slot * (parts + 1)), then the block's sum of
    the values they make (sum over p of scale_p * sum(q_p))."""
    qa, qs, _ = scratch
    values = [kb.vload(src, at + i * LANES, LANES) for i in range(block // LANES)]
    amax = reduce_lanes(kb, tree([kb.intrinsic("fabs", v) for v in values],
                                 lambda x, y: vmax(kb, x, y)), lambda x, y: vmax(kb, x, y))
    # exact division, not fast-math's reciprocal: onnxruntime's rounding of a * 127 / max
    inverse = kb.select(kb.b.fcmp_ordered(">", amax, kb.f32(0.0)),
                        kb.fdiv(kb.f32(127.0), amax, fast=False), kb.f32(0.0))
    scale, total = kb.fdiv(amax, kb.f32(127.0), fast=False), kb.f32(0.0)
    for p in range(parts):
        ints, minus_scale = [], kb.splat(kb.fsub(kb.f32(0.0), scale), LANES)
        for i, v in enumerate(values):
            q = kb.intrinsic("roundeven", kb.fmul(v, kb.splat(inverse, LANES), fast=False))
            if p:  # a residual within half a step of the part before, but clamped
                q = kb.intrinsic("maxnum", kb.intrinsic("minnum", q, vconst(127.0, LANES)),
                                 vconst(-127.0, LANES))
            if p + 1 < parts:  # what is left for the next part: exact in one FMA
                values[i] = fma(kb, q, minus_scale, v)
            q = kb.b.fptosi(q, ir.VectorType(I32, LANES))
            ints.append(q)
            q8 = kb.b.trunc(q, ir.VectorType(I8, LANES))
            q8 = kb.b.shuffle_vector(q8, q8, ir.Constant(ir.VectorType(I32, LANES),
                                                         _EVENS_FIRST))
            kb.b.store(q8, kb.gep(qa, (slot * parts + p) * block + i * LANES), align=1)
        count = kb.b.sitofp(reduce_lanes(kb, tree(ints, kb.b.add), kb.b.add), F32)
        kb.store(qs, slot * (parts + 1) + p, scale)
        total = fma(kb, count, scale, total)
        scale = kb.fdiv(scale, kb.f32(STEPS), fast=False)
        inverse = kb.fmul(inverse, kb.f32(STEPS), fast=False)
    kb.store(qs, slot * (parts + 1) + parts, total)


def _quantize_rows(kb, node, a, m0, rows_n: int, scratch, parts: int) -> None:
    """Rows m0 .. m0 + rows_n of `a` into scratch = (qa, qs, pad): per row nb blocks
    (_quantize_block); pad, a block of floats: the last partial block, zero-padded."""
    pad = scratch[2]
    k_n, block = node.attr("k"), node.attr("block")
    full, tail = divmod(k_n, block)
    nb = full + (tail > 0)
    with kb.loop(0, rows_n, "qr") as r:
        with kb.loop(0, full, "qb") as blk:
            _quantize_block(kb, a, (m0 + r) * k_n + blk * block, block, scratch,
                            r * nb + blk, parts)
        if tail:
            for i in range(block // LANES):
                kb.vstore(pad, i * LANES, zeros(LANES))
            with kb.loop(0, tail, "qt") as t:
                kb.store(pad, t, kb.load(a, (m0 + r) * k_n + full * block + t))
            _quantize_block(kb, pad, 0, block, scratch, r * nb + full, parts)


def _tile(kb, node, ins, g, r0, rows_n: int, scratch, parts: int) -> list[ir.Value]:
    """Per row r0 .. r0 + rows_n of the quantized chunk, the 16-lane vector of group
    g's outputs (bias and epilogue not applied)."""
    b, scales = ins[1], ins[2]
    zp = ins[3] if node.attr("zero_points") != "none" else None
    qa, qs, _ = scratch
    _, nb, blob = b.type.shape
    block, runs = node.attr("block"), blob // 4  # 4-byte runs per column and block
    # a row's vpdpbusd chains: 2 * parts * unroll (their latency)
    unroll = 2 if rows_n == 1 and parts == 1 else 1
    accs = [kb.local(zeros(LANES)) for _ in range(rows_n)]
    with kb.loop(0, nb, "blk") as blk:
        zv = cols_zero_points(kb, node, zp, g, blk, nb)
        sv = kb.vload(scales, (g * nb + blk) * LANES, LANES)
        sums = [[[kb.local(zeros(LANES, I32)) for _ in range(2 * unroll)]
                 for _ in range(parts)] for _ in range(rows_n)]
        with kb.loop(0, runs // unroll, "run") as step:
            for u in range(unroll):
                run = step * unroll + u
                at = ((g * nb + blk) * runs + run) * 4 * LANES
                raw_bytes = kb.b.load(kb.gep(b, at), typ=ir.VectorType(I8, 4 * LANES), align=1)
                if parts > 1:
                    prefetch(kb, b, at + PREFETCH_BYTES)
                nibbles = (kb.b.and_(raw_bytes, ir.Constant(raw_bytes.type, 15)),
                           kb.b.lshr(raw_bytes, ir.Constant(raw_bytes.type, 4)))
                for r, p in ((r, p) for r in range(rows_n) for p in range(parts)):
                    at = (((r0 + r) * nb + blk) * parts + p) * block + run * 8
                    for half, w in enumerate(nibbles):
                        word = kb.b.load(kb.gep(qa, at + 4 * half), typ=I32, align=1)
                        acc = sums[r][p][2 * u + half]
                        kb.set(acc, dot(kb, "vnni", kb.get(acc), w,
                                        broadcast(kb, "vnni", word, LANES)))
        for r in range(rows_n):
            slot = ((r0 + r) * nb + blk) * (parts + 1)
            dots = [kb.b.sitofp(tree([kb.get(x) for x in sums[r][p]], kb.b.add),
                                ir.VectorType(F32, LANES)) for p in range(parts)]
            a_sum = kb.splat(kb.load(qs, slot + parts), LANES)
            # sum((w - z) a) = sum_p s_p d_p - z sum(a), times the weights' scales
            x = kb.fmul(dots[0], kb.splat(kb.load(qs, slot), LANES))
            for p in range(1, parts):
                x = fma(kb, dots[p], kb.splat(kb.load(qs, slot + p), LANES), x)
            x = kb.fsub(x, kb.fmul(zv, a_sum))
            kb.set(accs[r], fma(kb, x, sv, kb.get(accs[r])))
    return [kb.get(acc) for acc in accs]


def _store_first(kb, y, count: int, out, at, bias, col0, epilogue) -> None:
    """The first `count` lanes of y to out from flat index `at`, column col0 (the
    last, partial group of columns), each biased and finished alone."""
    for c in range(count):
        v = kb.lane(y, c)
        if bias is not None:
            v = kb.fadd(v, kb.load(bias, col0 + c))
        if epilogue is not None:
            v = epilogue(v, kb.unflatten(at + c, out.type.shape))
        kb.store(out, at + c, v)


def _lower_int8(kb, node, ins, out, epilogue, parts: int) -> None:
    """The cols16x4 layout's product (module doc) with `a` in `parts` int8 parts: rows
    in chunks of at most QUANT_BYTES of int8 values, each quantized, then its groups
    over the threads."""
    a, bias = ins[0], ins[-1] if node.attr("bias") else None
    k_n, n_n, block = node.attr("k"), out.type.shape[-1], node.attr("block")
    rows, (groups, nb, _) = a.type.size // k_n, ins[1].type.shape
    groups //= LANES  # whole groups of 16 columns, the last padded where N is no multiple
    most = max(1, QUANT_BYTES // (nb * block * parts))
    chunks = -(-rows // most)
    chunk = -(-rows // chunks)
    if chunks > 1 and chunk > ROWS:
        chunk += -chunk % ROWS
    scratch = (kb.scratch(chunk * nb * block * parts, "int8"),
               kb.scratch(chunk * nb * (parts + 1)),
               kb.scratch(block) if k_n % block else None)
    first = kb.scratch(1, "int64")  # a chunk's first row, for the work items to read

    def rows_from(m0, count: int, name: str) -> None:
        _quantize_rows(kb, node, a, m0, count, scratch, parts)
        if not isinstance(m0, int):
            kb.store(first, 0, m0)
        with parallel_for(kb, groups, name, work=count * n_n * k_n,
                          shared=(*scratch[:2], first)) as g:
            start = m0 if isinstance(m0, int) else kb.index(kb.load(first, 0))

            def finish(r0, rows_n: int) -> None:
                for r, y in enumerate(_tile(kb, node, ins, g, r0, rows_n, scratch, parts)):
                    at = (start + r0 + r) * n_n + g * LANES
                    if not n_n % LANES:
                        store_lanes(kb, y, out, at, bias, g * LANES, epilogue)
                        continue
                    with kb.b.if_else(kb.below(g, n_n // LANES)) as (whole, last):
                        with whole:
                            store_lanes(kb, y, out, at, bias, g * LANES, epilogue)
                        with last:
                            _store_first(kb, y, n_n % LANES, out, at, bias, g * LANES,
                                         epilogue)

            if count >= ROWS:
                with kb.loop(0, count // ROWS, "rt") as rt:
                    finish(rt * ROWS, ROWS)
            if count % ROWS:
                finish(count // ROWS * ROWS, count % ROWS)

    whole = rows // chunk
    if whole > 1:
        with kb.loop(0, whole, "chunk") as c:
            rows_from(c * chunk, chunk, "groups")
    elif whole:
        rows_from(0, chunk, "groups")
    if rows % chunk:
        rows_from(whole * chunk, rows % chunk, "last_groups")


def _lower(kb, node, ins, out, epilogue):
    """accuracy 4: one int8 part; other levels in cols16x4: three (fp32-class) for
    fewer than GEMM_ROWS rows, else the float kernel's blocked form (a prefill's
    products are compute-bound: three int8 parts would cost three level-4 products)."""
    rows = ins[0].type.size // node.attr("k")
    if node.attr("layout") != "cols16x4":
        lower_float(kb, node, ins, out, epilogue)
    elif node.attr("accuracy") == 4:
        _lower_int8(kb, node, ins, out, epilogue, 1)
    elif blocked_width(kb, node, rows, out.type.shape[-1]):
        lower_float(kb, node, ins, out, epilogue)
    else:
        _lower_int8(kb, node, ins, out, epilogue, 3)


lowering("matmul_nbits", lower=_lower)
