"""matmul_nbits (pipeline/ops/nbits.py): y = a @ W + bias with W's 4- or 8-bit values
read packed, in onnxruntime's MatMulNBits layout, and dequantized in the inner loop.

The weights stay as the model stores them: a column's K values in blocks, each block a
run of `blob` bytes (4-bit: two values a byte, the even one in the low nibble), so the
library's weights are a quarter (4-bit) or half (8-bit) of float16's and an eighth or
quarter of float32's, and every weight byte is read once per call: a batch-1 product
(a decoder's token step) is bound by that stream.

The work items are groups of V (16) output columns, split over the threads; the
columns past the last whole group (N not a multiple of V) are one more item, done a
column at a time. Per column, the rows of `a` go R at a time: per block, each V-lane
vector of V weights is loaded once (V/2 bytes for 4 bits: unpacked with a mask, a shift
and one interleaving shuffle, converted to float and less the block's zero point) and
multiplied into the R rows' block sums; a block sum then meets its scale in one FMA
into the row's V-lane accumulator, so per weight the kernel does the unpacking and R
FMAs, and per block R more. With 4 bits in blocks of a multiple of 2V (32, 64...) a
group first copies its R rows of `a` to its stack with each 2V values reordered evens
first (_split_rows), so 2V weights (V bytes) unpack to two vectors, the low nibbles and
the high ones, with no shuffle. A last partial block (K not a multiple of the block
size) runs value by value. A group's 16 accumulators per row are summed into one
vector of the 16 columns' outputs by a tree of pairwise shuffles and adds (15 steps,
where one column's lane sum takes 4: a 1-row call, a decoder's token step, spent as
much on those sums as on the weights), which gets the bias and the fused epilogue as
one vector (a GELU lane by lane had made the MLP's up projection 3x the others) and
one store. The remainder columns are summed, biased and finished one by one.

These are the float32 kernels (lower_float); kernels/nbits_int8.py registers the
op's lowering and, for the cols16x4 layout (accuracy_level 4 on AVX-512 VNNI),
quantizes `a` to int8 and multiplies on vpdpbusd instead.
"""

from __future__ import annotations

import llvmlite.ir as ir

from pipeline.dsl.builder import F32, I32
from pipeline.dsl.index import raw
from pipeline.dsl.vector import (
    apply_epilogue,
    fma,
    parallel_for,
    reduce_lanes,
    transpose_square,
    zeros,
)

LANES = 16  # one AVX-512 register of floats; two AVX2 ones, which LLVM splits it into
ROWS = 4    # rows of `a` sharing each dequantized weight vector
SPLIT_BYTES = 64 << 10  # the most stack a work item's reordered rows of `a` take
A_SUM_BYTES = 16 << 10  # the most stack the cols16 kernel's block sums of `a` take
GEMM_ROWS = 16  # from this many rows, the blocked form (_lower_blocked): a rows
# kernel's blocks of 32 and 128, not its 8 (code size: a 4-bit library is mostly code)


def _weights(kb, b, at, bits: int) -> ir.Value:
    """LANES consecutive weights (as float, not yet less their zero point) of the
    packed bytes of `b` from byte offset `at`."""
    n_bytes = LANES * bits // 8
    raw = kb.b.load(kb.gep(b, at), typ=ir.VectorType(ir.IntType(8), n_bytes), align=1)
    wide = kb.b.zext(raw, ir.VectorType(I32, n_bytes))
    if bits == 4:
        lo = kb.b.and_(wide, ir.Constant(wide.type, 15))
        hi = kb.b.lshr(wide, ir.Constant(wide.type, 4))
        order = [k // 2 + (n_bytes if k % 2 else 0) for k in range(LANES)]
        wide = kb.b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, LANES), order))
    return kb.b.uitofp(wide, ir.VectorType(F32, LANES))


def packed_value(kb, b, at, index, bits: int) -> ir.Value:
    """The `index`-th `bits`-bit value of the packed bytes of `b` from byte `at`, as
    float (an Index `index`)."""
    if bits == 8:
        return kb.b.uitofp(kb.load(b, at + index), F32)
    byte = kb.load(b, at + index // 2)
    shift = kb.b.trunc(raw((index % 2) * 4), I32)
    return kb.b.uitofp(kb.b.and_(kb.b.lshr(byte, shift), ir.Constant(I32, 15)), F32)


def zero_point(kb, node, zp, col, blk, nb: int) -> ir.Value:
    """Column `col`'s zero point of block `blk`, as float."""
    bits, kind = node.attr("bits"), node.attr("zero_points")
    if kind == "none":
        return kb.f32(2.0 ** (bits - 1))
    if kind == "float":
        return kb.load(zp, col * nb + blk)
    return packed_value(kb, zp, col * zp.type.shape[1], blk, bits)


def _split_rows(kb, node, a, m0, rows_n: int, split) -> None:
    """Rows m0 .. m0 + rows_n of `a`, their whole blocks, into `split` with each run of
    2 * LANES values stored as its even-indexed values, then its odd ones: the order
    of a 4-bit weight vector's low and high nibbles (_tile)."""
    k_n, block = node.attr("k"), node.attr("block")
    whole = k_n // block * block
    evens = ir.Constant(ir.VectorType(I32, LANES), list(range(0, 2 * LANES, 2)))
    odds = ir.Constant(ir.VectorType(I32, LANES), list(range(1, 2 * LANES, 2)))
    for r in range(rows_n):
        with kb.loop(0, whole // (2 * LANES), "split") as c:
            at = (m0 + r) * k_n + c * (2 * LANES)
            lo, hi = kb.vload(a, at, LANES), kb.vload(a, at + LANES, LANES)
            to = r * whole + c * (2 * LANES)
            kb.vstore(split, to, kb.b.shuffle_vector(lo, hi, evens))
            kb.vstore(split, to + LANES, kb.b.shuffle_vector(lo, hi, odds))


def _split_weights(kb, b, at, zv) -> tuple[ir.Value, ir.Value]:
    """The 2 * LANES 4-bit weights of the bytes of `b` from `at`, less the zero point
    vector zv, as two float vectors: the low nibbles (the even indices), then the
    high ones (no interleaving shuffle: _split_rows orders `a` to match)."""
    raw_bytes = kb.b.load(kb.gep(b, at), typ=ir.VectorType(ir.IntType(8), LANES), align=1)
    wide = kb.b.zext(raw_bytes, ir.VectorType(I32, LANES))
    nibbles = (kb.b.and_(wide, ir.Constant(wide.type, 15)),
               kb.b.lshr(wide, ir.Constant(wide.type, 4)))
    return tuple(kb.b.fsub(kb.b.uitofp(v, ir.VectorType(F32, LANES)), zv) for v in nibbles)


def _tile(kb, node, ins, col, m0, rows_n: int, split=None):
    """The sums over K of rows m0 .. m0 + rows_n of `a` times column `col` of W, per
    row a LANES-lane vector of partial sums; `split`: those rows as _split_rows
    wrote them (4-bit weights, blocks of a multiple of 2 * LANES)."""
    a, b, scales = ins[:3]
    zp = ins[3] if node.attr("zero_points") != "none" else None
    bits, block, k_n = node.attr("bits"), node.attr("block"), node.attr("k")
    _, nb, blob = b.type.shape
    full, tail = k_n // block, k_n % block
    accs = [kb.local(zeros(LANES)) for _ in range(rows_n)]
    with kb.loop(0, full, "blk") as blk:
        zv = kb.splat(zero_point(kb, node, zp, col, blk, nb), LANES)
        parts = [zeros(LANES)] * rows_n
        for step in range(block // LANES if split is None else 0):
            w = kb.b.fsub(_weights(kb, b, (col * nb + blk) * blob + step * LANES * bits // 8,
                                   bits), zv)
            for r in range(rows_n):
                av = kb.vload(a, (m0 + r) * k_n + blk * block + step * LANES, LANES)
                parts[r] = fma(kb, av, w, parts[r])
        for step in range(block // (2 * LANES) if split is not None else 0):
            ws = _split_weights(kb, b, (col * nb + blk) * blob + step * LANES, zv)
            for r in range(rows_n):
                at = r * full * block + blk * block + step * 2 * LANES
                for half, w in enumerate(ws):
                    parts[r] = fma(kb, kb.vload(split, at + half * LANES, LANES), w, parts[r])
        sv = kb.splat(kb.load(scales, col * nb + blk), LANES)
        for r in range(rows_n):
            kb.set(accs[r], fma(kb, parts[r], sv, kb.get(accs[r])))
    sums = [kb.get(acc) for acc in accs]
    if not tail:
        return sums
    z = zero_point(kb, node, zp, col, full, nb)
    parts = [kb.local(kb.f32(0.0)) for _ in range(rows_n)]
    with kb.loop(0, tail, "t") as t:
        w = kb.fsub(packed_value(kb, b, (col * nb + full) * blob, t, bits), z)
        for r in range(rows_n):
            x = kb.load(a, (m0 + r) * k_n + full * block + t)
            kb.set(parts[r], kb.fadd(kb.get(parts[r]), kb.fmul(x, w)))
    s = kb.load(scales, col * nb + full)
    # The partial block's sum joins lane 0 (the lanes are summed later).
    return [kb.with_lane(v, 0, kb.fadd(kb.lane(v, 0), kb.fmul(kb.get(p), s)))
            for v, p in zip(sums, parts, strict=True)]


def _merge(kb, x: ir.Value, y: ir.Value, level: int) -> ir.Value:
    """Two vectors of partial sums at `level` (each holding 2^level columns' sums, a
    column in LANES >> level consecutive lanes) -> one at level + 1: the first halves
    of each column's lanes plus the second halves, x's columns first."""
    w, n = LANES >> level, LANES
    cols, h = n // w, w // 2
    lo = [v * n + c * w + i for v in (0, 1) for c in range(cols) for i in range(h)]
    hi = [v * n + c * w + h + i for v in (0, 1) for c in range(cols) for i in range(h)]
    pick = [kb.b.shuffle_vector(x, y, ir.Constant(ir.VectorType(I32, n), order))
            for order in (lo, hi)]
    return kb.fadd(*pick)


def _group_sums(kb, node, ins, col0, m0, rows_n: int, split, sums) -> list[ir.Value]:
    """Per row of the tile, the LANES-lane vector of the outputs of columns col0 ..
    col0 + LANES (bias and epilogue not yet applied). The columns are a loop (unrolled
    16 times, a 4-bit decoder's library grew by a third) that leaves each column's
    partial sums in `sums` (stack, rows_n x LANES vectors); the tree then reads them."""
    with kb.loop(0, LANES, "c") as c:
        for r, v in enumerate(_tile(kb, node, ins, col0 + c, m0, rows_n, split)):
            kb.vstore(sums, (c + r * LANES) * LANES, v)
    rows = []
    for r in range(rows_n):
        level = [kb.vload(sums, (c + r * LANES) * LANES, LANES) for c in range(LANES)]
        depth = 0
        while len(level) > 1:
            level = [_merge(kb, x, y, depth) for x, y in zip(level[::2], level[1::2],
                                                              strict=True)]
            depth += 1
        rows.append(level[0])
    return rows


def cols_zero_points(kb, node, zp, g, blk, nb: int) -> ir.Value:
    """The zero points of group g's 16 columns for block blk (cols16), as a vector."""
    kind = node.attr("zero_points")
    if kind == "none":
        return kb.splat(kb.f32(8.0), LANES)
    if kind == "float":
        return kb.vload(zp, (g * nb + blk) * LANES, LANES)
    pairs = zp.type.shape[1]  # two blocks' zero points a byte, the even one low
    raw_bytes = kb.b.load(kb.gep(zp, (g * pairs + blk // 2) * LANES),
                          typ=ir.VectorType(ir.IntType(8), LANES), align=1)
    wide = kb.b.zext(raw_bytes, ir.VectorType(I32, LANES))
    shift = kb.b.trunc(raw((blk % 2) * 4), I32)
    wide = kb.b.lshr(wide, kb.splat(shift, LANES))
    return kb.b.uitofp(kb.b.and_(wide, ir.Constant(wide.type, 15)), ir.VectorType(F32, LANES))


def store_lanes(kb, y, out, at, bias, col0, epilogue) -> None:
    """Store LANES outputs y at flat index `at` of out, after adding the bias from
    column col0 and applying the fused epilogue."""
    if bias is not None:
        y = kb.fadd(y, kb.vload(bias, col0, LANES))
    if epilogue is not None:
        y = apply_epilogue(kb, epilogue, y, kb.unflatten(at, out.type.shape))
    kb.vstore(out, at, y)


def _lower_cols(kb, node, ins, out, epilogue):
    """The cols16 layout (ops/nbits.py): a work item is a group of 16 columns, whose
    outputs are vectors from the start: per block, per pair of values, 16 bytes hold
    both values of the 16 columns (a mask and a shift: two float vectors, less the
    zero points), each multiplied by a broadcast value of `a` into the R rows'
    block sums, which meet the block's 16 scales in one FMA. No lane sums, no
    shuffles: per 32 weights one load, four vector operations and 2R FMAs; the zero
    points are taken off per block (z times the row's sum over the block)."""
    a, b, scales = ins[:3]
    zp = ins[3] if node.attr("zero_points") != "none" else None
    bias = ins[-1] if node.attr("bias") else None
    k_n, n_n, block = node.attr("k"), out.type.shape[-1], node.attr("block")
    rows, nb = ins[0].type.size // k_n, b.type.shape[1]

    def block_sum(r, blk) -> ir.Value:
        """Row r's sum over block blk of `a`, for the zero points."""
        at = r * k_n + blk * block
        chunks = [kb.vload(a, at + c * LANES, LANES) for c in range(block // LANES)]
        return reduce_lanes(kb, tree(chunks, kb.fadd), kb.fadd)

    # Those sums once per call, not once per group of columns (a lane sum per block
    # and group was a fifth of a decode step's 4-bit kernels), where they fit
    # A_SUM_BYTES of stack; else per group.
    a_sums = kb.scratch(rows * nb) if rows * nb * 4 <= A_SUM_BYTES else None
    if a_sums is not None:
        with kb.loop(0, rows, "sr") as r, kb.loop(0, nb, "sb") as blk:
            kb.store(a_sums, r * nb + blk, block_sum(r, blk))

    def tile(g, m0, rows_n: int) -> None:
        # Pairs per loop step: each row's block sum is 2 * unroll separate chains (FMA
        # latency, not memory, bounded a 1-row call's one chain: 4-bit decode weights
        # at ~18% of the read bandwidth), summed at the block's end.
        unroll = next(u for u in (4 // rows_n, 2, 1) if u and not (block // 2) % u)
        accs = [kb.local(zeros(LANES)) for _ in range(rows_n)]
        with kb.loop(0, nb, "blk") as blk:
            zv = cols_zero_points(kb, node, zp, g, blk, nb)
            parts = [[kb.local(zeros(LANES)) for _ in range(2 * unroll)]
                     for _ in range(rows_n)]
            with kb.loop(0, block // 2 // unroll, "pair") as step:
                for u in range(unroll):
                    p = step * unroll + u
                    raw_bytes = kb.b.load(
                        kb.gep(b, ((g * nb + blk) * (block // 2) + p) * LANES),
                        typ=ir.VectorType(ir.IntType(8), LANES), align=1)
                    wide = kb.b.zext(raw_bytes, ir.VectorType(I32, LANES))
                    ws = [kb.b.uitofp(v, ir.VectorType(F32, LANES))
                          for v in (kb.b.and_(wide, ir.Constant(wide.type, 15)),
                                    kb.b.lshr(wide, ir.Constant(wide.type, 4)))]
                    for r in range(rows_n):
                        at = (m0 + r) * k_n + blk * block + p * 2
                        for half, w in enumerate(ws):
                            acc = parts[r][2 * u + half]
                            kb.set(acc, fma(kb, kb.splat(kb.load(a, at + half), LANES), w,
                                            kb.get(acc)))
            sv = kb.vload(scales, (g * nb + blk) * LANES, LANES)
            for r in range(rows_n):  # sum((q - z) a) = sum(q a) - z sum(a)
                total = kb.splat(block_sum(m0 + r, blk) if a_sums is None else
                                 kb.load(a_sums, (m0 + r) * nb + blk), LANES)
                product = kb.fsub(tree([kb.get(x) for x in parts[r]], kb.fadd),
                                  kb.fmul(zv, total))
                kb.set(accs[r], fma(kb, product, sv, kb.get(accs[r])))
        for r in range(rows_n):
            store_lanes(kb, kb.get(accs[r]), out, (m0 + r) * n_n + g * LANES, bias,
                         g * LANES, epilogue)

    with parallel_for(kb, n_n // LANES, "groups", work=rows * n_n * k_n,
                      shared=() if a_sums is None else (a_sums,)) as g:
        if rows >= ROWS:
            with kb.loop(0, rows // ROWS, "rt") as rt:
                tile(g, rt * ROWS, ROWS)
        if rows % ROWS:
            tile(g, rows // ROWS * ROWS, rows % ROWS)


def tree(values: list[ir.Value], combine) -> ir.Value:
    """values[0] combined with values[1], ... pairwise (short dependency chains: a sum
    of n accumulators in log2(n) steps); an odd one out joins the next round."""
    while len(values) > 1:
        pairs = zip(values[::2], values[1::2], strict=False)
        values = [combine(x, y) for x, y in pairs] + values[len(values) // 2 * 2:]
    return values[0]


def blocked_width(kb, node, rows: int, n_n: int) -> int:
    """The columns per work item of the blocked form for this product, or 0 where it
    does not apply: fewer than GEMM_ROWS rows, K not whole blocks, or no width of 64,
    32 or 16 dividing N (at most 4 of the target's vectors with AVX-512's 32
    registers, 2 below, so that 6 rows of them fit; at least the 16 of a square)."""
    vb = getattr(kb, "vector_width", 8)  # render.py sets the target's
    if rows < GEMM_ROWS or node.attr("k") % node.attr("block"):
        return 0
    limit = max(LANES, (4 if vb >= 16 else 2) * vb)
    return next((w for w in (4 * LANES, 2 * LANES, LANES) if w <= limit and not n_n % w), 0)


def _lower_blocked(kb, node, ins, out, epilogue, width: int) -> None:
    """The product for many rows (a prefill) as a blocked matrix product: per work
    item of `width` columns, each chunk of K is dequantized once into a stack panel
    [k][width] (_dequantize), then tiles of R rows x the width's vectors of outputs
    accumulate in registers over the chunk, a[m, k] broadcast once per tile row; the
    bias and the epilogue run over the item's outputs at the end."""
    a, bias = ins[0], ins[-1] if node.attr("bias") else None
    k_n, n_n, block = node.attr("k"), out.type.shape[-1], node.attr("block")
    rows = a.type.size // k_n
    vb = min(getattr(kb, "vector_width", 8), width)
    vectors, items = width // vb, n_n // width
    # rows per tile: 6 (24 accumulators with AVX-512), or 4 where that leaves no
    # remainder tile (a rows kernel's 32 and 128: less code, no 2-row tile)
    tile = 4 if rows % 6 and not rows % 4 else 6
    # k per panel: whole blocks dividing K (one chunk's code, looped), at most 256
    # (64 KiB at width 64) unless a block is longer
    per = max(d for d in range(1, max(1, 256 // block) + 1) if (k_n // block) % d == 0)
    kc = per * block
    full = rows - rows % tile
    with parallel_for(kb, items, "blocks", work=rows * n_n * k_n) as item:
        n0, panel = item * width, kb.scratch(kc * width)
        with kb.loop(0, k_n // kc, "kc") as c:
            k = (c * kc, kc, c < 1)  # the first chunk starts the sums from zero
            if node.attr("layout") in ("cols16", "cols16x4"):
                _dequantize_cols(kb, node, ins, panel, (item, width), k[0], kc)
            else:
                _dequantize(kb, node, ins, panel, n0, width, k[0], kc)
            if full:
                with kb.loop(0, full // tile, "mt") as mt:
                    _panel_tile(kb, a, panel, out, (mt * tile, tile), (n0, width, vb), k, k_n)
            if rows % tile:
                _panel_tile(kb, a, panel, out, (full, rows % tile), (n0, width, vb), k, k_n)
        with kb.loop(0, rows, "er") as m:
            lead = kb.unflatten(m, out.type.shape[:-1])
            for v in range(vectors):
                at, col = m * n_n + n0 + v * vb, n0 + v * vb
                y = kb.vload(out, at, vb)
                if bias is not None:
                    y = kb.fadd(y, kb.vload(bias, col, vb))
                kb.vstore(out, at, apply_epilogue(kb, epilogue, y, lead + [col]))


def _dequantize(kb, node, ins, panel, n0, width: int, k0, k_len: int) -> None:
    """panel[k][j] = W[k0 + k, n0 + j] as float (less the zero point, times the
    scale) for k < k_len, j < width, from the model's layout (a column's K values
    in blocks): per 16 columns and LANES values of k, each column's vector
    dequantized, then the 16 x LANES square transposed."""
    b, scales = ins[1], ins[2]
    zp = ins[3] if node.attr("zero_points") != "none" else None
    bits, block = node.attr("bits"), node.attr("block")
    _, nb, blob = b.type.shape
    with kb.loop(0, k_len // LANES, "ks") as ks, kb.loop(0, width // LANES, "cb") as cb:
        k, c0 = k0 + ks * LANES, cb * LANES
        blk, within = k // block, k % block
        columns = []
        for j in range(LANES):
            col = n0 + c0 + j
            w = kb.b.fsub(_weights(kb, b, (col * nb + blk) * blob + within * bits // 8,
                                   bits), kb.splat(zero_point(kb, node, zp, col, blk, nb),
                                                   LANES))
            columns.append(kb.b.fmul(w, kb.splat(kb.load(scales, col * nb + blk), LANES)))
        for lane, row in enumerate(transpose_square(kb, columns)):
            kb.vstore(panel, (ks * LANES + lane) * width + c0, row)


def _dequantize_cols(kb, node, ins, panel, item, k0, k_len: int) -> None:
    """_dequantize from the cols16 layouts: a vector's bytes hold `run` bytes of each
    of 16 columns (cols16: 1, a pair of k's values; cols16x4: 4, eight), each value
    already a vector of a panel row (no transpose); scales and zero points are
    vectors of the 16 columns. item: (the work item, its width)."""
    b, scales = ins[1], ins[2]
    zp = ins[3] if node.attr("zero_points") != "none" else None
    block, nb = node.attr("block"), b.type.shape[1]
    run = 4 if node.attr("layout") == "cols16x4" else 1
    (item, width), vector = item, ir.VectorType(F32, LANES)
    with kb.loop(0, k_len // block, "bi") as bi, kb.loop(0, width // LANES, "cg") as cg:
        g, blk = item * (width // LANES) + cg, k0 // block + bi
        zv = cols_zero_points(kb, node, zp, g, blk, nb)
        sv = kb.vload(scales, (g * nb + blk) * LANES, LANES)
        with kb.loop(0, block // (2 * run), "run") as p:
            at = ((g * nb + blk) * (block // (2 * run)) + p) * run * LANES
            if run == 1:
                raw_bytes = kb.b.load(kb.gep(b, at), typ=ir.VectorType(ir.IntType(8), LANES),
                                      align=1)
                wide = kb.b.zext(raw_bytes, ir.VectorType(I32, LANES))
            else:  # a column's 4 bytes, little-endian: value j at bits 4j
                wide = kb.b.load(kb.gep(b, at), typ=ir.VectorType(I32, LANES), align=1)
            for j in range(2 * run):
                v = kb.b.and_(kb.b.lshr(wide, ir.Constant(wide.type, 4 * j)),
                              ir.Constant(wide.type, 15))
                w = kb.fmul(kb.fsub(kb.b.uitofp(v, vector), zv), sv)
                kb.vstore(panel, (bi * block + p * 2 * run + j) * width + cg * LANES, w)


def _panel_tile(kb, a, panel, out, m, n, k, k_n: int) -> None:
    """out[m0 + r, n0 + j] (+)= sum over the chunk's k of a[m0 + r, k] panel[k][j] for
    r < rows, j < width: rows x width/vb accumulators; the first chunk starts from
    zero (`first`, an i1: out is loaded but not used), later ones from what out holds.
    m: (m0, rows), n: (n0, width, vb), k: (k0, k_len, first)."""
    (m0, rows), (n0, width, vb), (k0, k_len, first) = m, n, k
    n_n = out.type.shape[-1]
    at = [[(m0 + r) * n_n + n0 + v * vb for v in range(width // vb)] for r in range(rows)]
    accs = [[kb.local(kb.select(first, zeros(vb), kb.vload(out, c, vb))) for c in row]
            for row in at]
    with kb.loop(0, k_len, "mk") as kk:
        ws = [kb.vload(panel, kk * width + v * vb, vb) for v in range(width // vb)]
        for r in range(rows):
            av = kb.splat(kb.load(a, (m0 + r) * k_n + k0 + kk), vb)
            for v, w in enumerate(ws):
                kb.set(accs[r][v], fma(kb, av, w, kb.get(accs[r][v])))
    for r in range(rows):
        for v in range(width // vb):
            kb.vstore(out, at[r][v], kb.get(accs[r][v]))


def lower_float(kb, node, ins, out, epilogue):
    """matmul_nbits in float32 (the layouts but cols16x4: kernels/nbits_int8.py)."""
    width = blocked_width(kb, node, ins[0].type.size // node.attr("k"), out.type.shape[-1])
    if width:
        _lower_blocked(kb, node, ins, out, epilogue, width)
        return
    if node.attr("layout") == "cols16":
        _lower_cols(kb, node, ins, out, epilogue)
        return
    k_n, n_n = node.attr("k"), out.type.shape[-1]
    rows = ins[0].type.size // k_n
    bias = ins[-1] if node.attr("bias") else None
    groups, rest = n_n // LANES, n_n % LANES

    # 4-bit weights in blocks of 32s: a group's rows of `a` reordered once (on the
    # stack, at most SPLIT_BYTES) so that each 16 bytes of weights unpack to two
    # vectors with no shuffle; the group's 16 columns share that. The buffer is made
    # in the work items' function (parallel_for's body), whose stack it is on.
    block = node.attr("block")
    k_whole, split_rows = k_n // block * block, min(ROWS, rows)
    splits = node.attr("bits") == 4 and block % (2 * LANES) == 0 and k_whole > 0 and \
        split_rows * k_whole * 4 <= SPLIT_BYTES
    split = sums = None

    def finish_group(g, m0, rows_n: int) -> None:
        if split is not None:
            _split_rows(kb, node, ins[0], m0, rows_n, split)
        for r, y in enumerate(_group_sums(kb, node, ins, g * LANES, m0, rows_n, split,
                                          sums)):
            store_lanes(kb, y, out, (m0 + r) * n_n + g * LANES, bias, g * LANES, epilogue)

    def finish_column(col, m0, rows_n: int) -> None:
        for r, v in enumerate(_tile(kb, node, ins, col, m0, rows_n)):
            y = reduce_lanes(kb, v, lambda x, z: kb.fadd(x, z))
            if bias is not None:
                y = kb.fadd(y, kb.load(bias, col))
            at = (m0 + r) * n_n + col
            if epilogue is not None:
                y = epilogue(y, kb.unflatten(at, out.type.shape))
            kb.store(out, at, y)

    def over_rows(finish, item) -> None:
        if rows >= ROWS:
            with kb.loop(0, rows // ROWS, "rt") as rt:
                finish(item, rt * ROWS, ROWS)
        if rows % ROWS:
            finish(item, rows // ROWS * ROWS, rows % ROWS)

    def remainder() -> None:
        with kb.loop(groups * LANES, n_n, "col") as col:
            over_rows(finish_column, col)

    with parallel_for(kb, groups + (rest > 0), "cols", work=rows * n_n * k_n) as item:
        split = kb.scratch(split_rows * k_whole) if splits and groups else None
        sums = kb.scratch(split_rows * LANES * LANES) if groups else None
        if not rest:
            over_rows(finish_group, item)
        elif not groups:
            remainder()
        else:
            with kb.b.if_else(kb.below(item, groups)) as (whole, last):
                with whole:
                    over_rows(finish_group, item)
                with last:
                    remainder()

