"""attention with runtime sequence lengths (docs/vm.md, "Symbolic dimensions"): the
lowering of an attention kernel whose Sq and Sk are symbolic, which a kernel over
symbolic rows cannot compute (the scores run along Sk).

An online softmax, flash-attention style, so nothing is sized by the sequence
length: per (batch, head), query rows in chunks of CHUNK; for each block of BLOCK keys
the block's Kᵀ and V are packed once for the chunk into stack panels ([D][BLOCK] and
[BLOCK][Dv']); the chunk's rows take it in tiles of ROWS: their scores are LANES-wide
vectors (ROWS x 2 independent FMA chains over D) stored to a stack row, then per row
the running maximum m and sum l (one pair of horizontal reductions per block), the
scores become exp(s - m), and the accumulators of Dv' floats are rescaled by
exp(m_old - m) and given sum_j p[j] V[j] over the block's valid keys (a tile
product: each V row loaded once for the tile's rows). The last, partial block's
other lanes score -inf. Rows are divided by l at the end. The work items are heads x
parts (the heads a static count; a part takes every parts-th query chunk of every
batch), split over the thread team; each body re-reads the runtime dimensions in its
own function (dsl/dims.py). With attribute appended (ops/attention.py) the keys come
from two sources, the cache's K and V and the new ones after them: the blocks run
over the one, then the other (the online softmax takes blocks in any order).

Measured against the static kernel built for one shape (docs/vm.md, "Speed"): packing
per tile of 4 rows and updating per 16 keys made this kernel 2x the static one at
(4, 128); per chunk and per 64 keys it is within a few percent.
"""

from __future__ import annotations

import contextlib
import functools
import itertools

import llvmlite.ir as ir

from pipeline.dsl.types import F32
from pipeline.dsl.vector import (
    fma,
    parallel_for,
    reduce_lanes,
    transpose_square,
    vconst,
    vmax,
    zeros,
)
from pipeline.errors import ModelError
from pipeline.ir.graph import row_major_strides
from pipeline.ops.geometry import logical_shapes, split_appended

LANES = 16  # keys per vector of scores
# Vectors of keys per block: the row's running maximum, sum and rescaling (two
# horizontal reductions and an exp) are paid once per block of LANES * SUBS keys.
SUBS = 4
BLOCK = LANES * SUBS
ROWS = 4    # query rows per tile (independent FMA chains)
# Query rows sharing one packing of a key block: the pack (scalar gathers of LANES
# keys and values) costs about as much as one tile's products, so it is done once
# for CHUNK rows, not once per tile; the chunk's state (m, l, accumulators) is a
# stack array of CHUNK rows.
CHUNK = 64
# Work items the thread team splits: each head's query chunks are dealt out in
# ITEMS // heads strided parts (a head alone per item left a 2-core team idle
# half the time with 3 heads, and the batch could not be split: it is runtime).
ITEMS = 16
# The work an item stands for when the team is sized (the runtime lengths are
# unknown at build time: enough for every thread to take part).
WORK_PER_ITEM = 1 << 20


def lower_attention_dims(kb, node, ins, out, epilogue=None, shapes=None) -> None:
    """out = softmax(Q Kᵀ * scale [+ mask]) V for the operands in their perms
    (pipeline/kernels/attention.py); shapes may hold Index values (the head sizes D
    and Dv are static: FuseAttention leaves symbolic ones alone). (FuseOps never
    gives attention an epilogue: it is opaque.)"""
    assert epilogue is None, "attention has no epilogue"
    # The converters' extras (kernels/attention.py) have no runtime-length form yet.
    extras = {"softcap": 0.0, "masked_rows": "nan", "output": "y"}
    unsupported = [k for k, d in extras.items() if node.attr(k, d) != d]
    if unsupported:
        raise ModelError(f"node {node.name!r} (attention): {', '.join(unsupported)} with "
                         "runtime lengths is not supported yet")
    (_, hn, _, _), _, _ = logical_shapes([t.type.shape for t in ins], node)
    if not isinstance(hn, int) or shapes is None:
        _attention(kb, node, ins, out, [t.type for t in (*ins, out)], None, 1)
        return
    parts = max(1, ITEMS // hn)
    with parallel_for(kb, hn * parts, "heads", work=hn * parts * WORK_PER_ITEM) as item:
        _attention(kb, node, ins, out, shapes(), item, parts)


class _Tile:
    """What the loops of one (batch, head) share: operands, strides, panels, state."""

    def __init__(self, kb, node, ins, out, types):
        self.kb, self.ins, self.out = kb, ins, out
        (ins, appended), out_type = split_appended(ins, node), types[-1]
        types, appended_types = split_appended(types[:-1], node)
        (self.bn, self.hn, self.sq, self.d), _, (_, _, _, self.dv) = \
            logical_shapes([t.shape for t in types[:3]], node)
        strides = [row_major_strides(t.shape) for t in types]
        self.qs = tuple(strides[0][p] for p in node.attr("q_perm"))
        # The key sources, each (K, its strides, V, its strides, key count, first key):
        # K and V, then the keys appended after them (attribute appended); the blocks
        # of keys run over each in turn (use)
        self.sources, self.sk = [], 0
        for k, v, kt, vt in [(ins[1], ins[2], *types[1:3])] + ([(
                *appended, *appended_types)] if appended else []):
            ks, vs = (tuple(row_major_strides(t.shape)[p] for p in node.attr(f"{n}_perm"))
                      for t, n in ((kt, "k"), (vt, "v")))
            count = kt.shape[node.attr("k_perm")[3]]
            self.sources.append((k, ks, v, vs, count, self.sk))
            self.sk = self.sk + count
        self.use(self.sources[0])
        out_perm = node.attr("out_perm")
        self.os = tuple(row_major_strides(out_type.shape)[out_perm.index(u)] for u in range(4))
        self.mask = (ins[3], types[3].shape, strides[3]) if len(ins) > 3 else None
        # mask_keys="last": the mask's columns are the last keys, the earlier ones
        # (a KV cache's) unmasked: key j reads column j - mask_from (ops/attention.py)
        self.mask_from = self.sk - types[3].shape[-1] \
            if self.mask is not None and node.attr("mask_keys", "all") == "last" else None
        self.scale, self.group = node.attr("scale"), node.attr("group", 1)
        # the accumulators' vector width: 8 lanes when Dv fits (a head of 8 would
        # otherwise compute 16 lanes, half of them padding)
        self.g = 8 if self.dv <= 8 else LANES
        self.dvp = -(-self.dv // self.g) * self.g
        self.kt, self.vp = kb.scratch(self.d * BLOCK), kb.scratch(BLOCK * self.dvp)
        self.acc, self.s = kb.scratch(CHUNK * self.dvp), kb.scratch(ROWS * BLOCK)
        self.m, self.l = kb.scratch(CHUNK), kb.scratch(CHUNK)
        # A chunk of one query row (a decode step) reads K and V rows where they are
        # when both run along their head dims (no panels: _one_row_scores)
        self.direct = all(isinstance(x, int) and x == 1 for x in (
            self.qs[3], *(ks[2] for _, ks, *_ in self.sources),
            *(vs[3] for _, _, _, vs, *_ in self.sources))) \
            and self.d % LANES == 0 and self.dv == self.dvp

    def kv_head(self, h):
        """The key head query head h reads (grouped-query attention: h // group)."""
        return h if self.group == 1 else h // self.group

    def use(self, source: tuple) -> None:
        """Make `source` (one of self.sources) the keys the block loops read: self.k,
        self.ks, self.v, self.vs, its key count self.part and first key self.key0."""
        self.k, self.ks, self.v, self.vs, self.part, self.key0 = source


def _attention(kb, node, ins, out, types, item, parts: int) -> None:
    """Every head, or work item `item` (head item // parts, its query chunks
    item % parts + k * parts: a head's items side by side, so each thread's range of
    items holds heads whole, also when only the first part has a chunk, as in a
    decode step); types: the buffers' types with Index shapes valid in
    the function being built."""
    t = _Tile(kb, node, ins, out, types)
    # V's padding lanes stay 0, Kᵀ's lanes never packed hold finite values: the panels
    # are zeroed once per call of the function, in its entry block (per work item,
    # 16 of them, that cost more than the attention itself at seq 7)
    memset = kb.module.globals.get("llvm.memset.p0.i64") or ir.Function(
        kb.module, ir.FunctionType(ir.VoidType(), [ir.PointerType(), ir.IntType(8),
                                                   ir.IntType(64), ir.IntType(1)]),
        name="llvm.memset.p0.i64")
    with kb.b.goto_block(kb.function.entry_basic_block):
        for buf, floats in ((t.vp, BLOCK * t.dvp), (t.kt, BLOCK * t.d)):
            kb.b.call(memset, [buf.ptr, ir.Constant(ir.IntType(8), 0),
                               ir.Constant(ir.IntType(64), 4 * floats),
                               ir.Constant(ir.IntType(1), 0)])
    if item is None:
        heads, part = kb.loop(0, t.hn, "h"), 0
    else:
        heads, part = contextlib.nullcontext(item // parts), item % parts
    chunks = (t.sq + (CHUNK - 1)) // CHUNK
    with kb.loop(0, t.bn, "b") as b, heads as h:
        with kb.loop(0, (chunks - part + (parts - 1)) // parts, "ck") as ck:
            c0 = (part + ck * parts) * CHUNK
            _query_chunk(t, b, h, c0, kb.smin(t.sq - c0, CHUNK))


def _query_chunk(t: _Tile, b, h, c0, n) -> None:
    """Query rows c0 .. c0 + n (n <= CHUNK) against every key block: each block is
    packed once, then the rows' tiles of ROWS take it, the last n % ROWS one by one."""
    kb = t.kb
    tiles = n // ROWS
    with kb.loop(0, n, "r0") as r:
        kb.store(t.m, r, kb.f32(-3.0e38))
        kb.store(t.l, r, kb.f32(0.0))
        for g in range(t.dvp // t.g):
            kb.vstore(t.acc, r * t.dvp + g * t.g, zeros(t.g))
    if t.direct:
        with kb.b.if_else(kb.i64(1) >= n) as (one, many):
            with one:
                _key_blocks(t, b, h, c0, n, tiles, direct=True)
            with many:
                _key_blocks(t, b, h, c0, n, tiles, direct=False)
    else:
        _key_blocks(t, b, h, c0, n, tiles, direct=False)
    with kb.loop(0, tiles, "ft") as it:
        _finish(t, b, h, c0, it * ROWS, ROWS)
    with kb.loop(tiles * ROWS, n, "fr") as i:
        _finish(t, b, h, c0, i, 1)


def _key_blocks(t: _Tile, b, h, c0, n, tiles, direct: bool) -> None:
    """The chunk's n rows take every key block of each key source in turn (t.sources):
    packed once (not `direct`: one row reads K and V in place), then the tiles of ROWS
    rows, the last n % ROWS alone."""
    kb = t.kb
    for source in t.sources:
        t.use(source)
        with kb.loop(0, (t.part + (BLOCK - 1)) // BLOCK, "jb") as jb:
            j0 = jb * BLOCK
            count = kb.smin(t.part - j0, BLOCK)  # the block's valid keys
            limit = kb.splat(kb.b.sitofp(count.value, F32), LANES)
            valid = [kb.b.fcmp_ordered("<", ir.Constant(ir.VectorType(F32, LANES), [
                float(sub * LANES + k) for k in range(LANES)]), limit) for sub in range(SUBS)]
            if direct:
                _tile_block(t, b, h, c0, 0, 1, j0, count, valid, direct=True)
            else:
                _pack(t, b, h, j0, count)
                with kb.loop(0, tiles, "it") as it:
                    _tile_block(t, b, h, c0, it * ROWS, ROWS, j0, count, valid)
                with kb.loop(tiles * ROWS, n, "ir") as i:
                    _tile_block(t, b, h, c0, i, 1, j0, count, valid)


def _tile_block(t: _Tile, b, h, c0, r0, rows: int, j0, count, valid,
                direct: bool = False) -> None:
    """Rows r0 .. r0 + rows of the chunk at c0 take the key block at j0 (packed, or
    `direct`: one row, K and V read in place): their scores a vector of keys at a
    time into t.s, then each row's update."""
    kb = t.kb
    for pair in range(0, SUBS, 2):
        scores = _one_row_scores(t, b, h, c0 + r0, j0, count, (pair, pair + 1)) if direct \
            else _scores(t, b, h, c0 + r0, rows, (pair, pair + 1))
        for r, sub in itertools.product(range(rows), (pair, pair + 1)):
            s = kb.fmul(scores[r][sub - pair], vconst(t.scale, LANES))
            if t.mask is not None:
                s = kb.fadd(s, _mask_vector(t, b, h, c0 + r0 + r, t.key0 + j0, sub * LANES,
                                            count))
            kb.vstore(t.s, r * BLOCK + sub * LANES,
                      kb.b.select(valid[sub], s, vconst(-3.0e38, LANES)))
    rescale = [_update_row(t, r0 + r, r * BLOCK) for r in range(rows)]
    if not direct:
        _accumulate(t, r0, rescale, count, lambda key, g: kb.vload(t.vp, key * t.dvp + g * t.g,
                                                                  t.g))
        return
    v0 = b * t.vs[0] + t.kv_head(h) * t.vs[1]
    _accumulate(t, r0, rescale, count,
                lambda key, g: kb.vload(t.v, v0 + (j0 + key) * t.vs[2] + g * t.g, t.g))


def _pack(t: _Tile, b, h, j0, count) -> None:
    """kt[c][lane] = K[j0 + lane][c], vp[lane][e] = V[j0 + lane][e] for the block's
    valid keys (a lane past them keeps an earlier block's finite values, or the zeros
    it started with: its score is replaced by -inf, its V row is not read). A V row
    contiguous over Dv is copied a vector at a time; K rows contiguous over D go
    LANES keys x LANES of D at a time, the square transposed in registers (element by
    element, the packing cost more than the scores of a decode step's one row)."""
    kb = t.kb
    k0, v0 = b * t.ks[0] + t.kv_head(h) * t.ks[1], b * t.vs[0] + t.kv_head(h) * t.vs[1]
    rows_whole = isinstance(t.vs[3], int) and t.vs[3] == 1 and t.dv == t.dvp
    scalar_from = 0  # the keys from here go element by element
    if isinstance(t.ks[2], int) and t.ks[2] == 1 and t.d % LANES == 0:
        with kb.loop(0, count // LANES, "sq") as sq, kb.loop(0, t.d // LANES, "cg") as cg:
            l0, c0 = sq * LANES, cg * LANES
            keys = [kb.vload(t.k, k0 + (j0 + l0 + r) * t.ks[3] + c0, LANES)
                    for r in range(LANES)]
            for c, column in enumerate(transpose_square(kb, keys)):
                kb.vstore(t.kt, (c0 + c) * BLOCK + l0, column)
        scalar_from = count // LANES * LANES
    with kb.loop(scalar_from, count, "lane") as lane:
        j = j0 + lane
        with kb.loop(0, t.d, "c") as c:
            kb.store(t.kt, c * BLOCK + lane, kb.load(t.k, k0 + c * t.ks[2] + j * t.ks[3]))
    with kb.loop(0, count, "vlane") as lane:
        j = j0 + lane
        if rows_whole:
            for g in range(t.dvp // t.g):
                kb.vstore(t.vp, lane * t.dvp + g * t.g,
                          kb.vload(t.v, v0 + j * t.vs[2] + g * t.g, t.g))
        else:
            with kb.loop(0, t.dv, "e") as e:
                kb.store(t.vp, lane * t.dvp + e,
                         kb.load(t.v, v0 + j * t.vs[2] + e * t.vs[3]))


def _scores(t: _Tile, b, h, i0, rows: int, subs: tuple[int, ...]) -> list:
    """[r][k]: row r of the tile's LANES scores q·k of the packed block's keys
    subs[k] * LANES.. (unscaled); each query element broadcast once for the subs."""
    kb = t.kb
    q0 = b * t.qs[0] + h * t.qs[1]
    accs = [[kb.local(zeros(LANES)) for _ in subs] for _ in range(rows)]
    with kb.loop(0, t.d, "c") as c:
        keys = [kb.vload(t.kt, c * BLOCK + sub * LANES, LANES) for sub in subs]
        for r in range(rows):
            qv = kb.splat(kb.load(t.ins[0], q0 + (i0 + r) * t.qs[2] + c * t.qs[3]), LANES)
            for k, key in enumerate(keys):
                kb.set(accs[r][k], fma(kb, qv, key, kb.get(accs[r][k])))
    return [[kb.get(a) for a in row] for row in accs]


def _one_row_scores(t: _Tile, b, h, i, j0, count, subs: tuple[int, ...]) -> list:
    """[[k]]: query row i's LANES scores q·k of keys j0 + subs[k] * LANES.. (unscaled),
    read from K in place: per key a vector of D / LANES products, then the LANES keys'
    vectors transposed and summed into one (a key past `count` reads key j0)."""
    kb = t.kb
    q0 = b * t.qs[0] + h * t.qs[1] + i * t.qs[2]
    k0 = b * t.ks[0] + t.kv_head(h) * t.ks[1]
    qv = [kb.vload(t.ins[0], q0 + c * LANES, LANES) for c in range(t.d // LANES)]
    scores = []
    for sub in subs:
        keys = []
        for lane in range(LANES):
            key = kb.index(kb.select(kb.i64(sub * LANES + lane) < count,
                                     j0 + (sub * LANES + lane), j0))
            row = k0 + key * t.ks[3]
            acc = zeros(LANES)
            for c, q in enumerate(qv):
                acc = fma(kb, q, kb.vload(t.k, row + c * LANES, LANES), acc)
            keys.append(acc)
        scores.append(functools.reduce(kb.fadd, transpose_square(kb, keys)))
    return [scores]


def _mask_vector(t: _Tile, b, h, i, j0, first: int, count):
    """The mask (broadcast to [B, H, Sq, Sk]) for keys j0 + first.., lanes past the
    block's `count` reading key j0's. One vector load when the mask runs along the
    keys and all LANES keys are valid columns of it (every vector of a block but
    the last, partial one and the one where mask_keys="last" starts), else lane by
    lane."""
    kb = t.kb
    mask, shape, strides = t.mask
    step = [0 if isinstance(n, int) and n == 1 else st
            for n, st in zip(shape, strides, strict=True)]
    if isinstance(shape[-1], int) and shape[-1] == 1:  # broadcast along the keys
        if t.mask_from is not None:  # (to the last key only)
            return _mask_lanes(t, b, h, i, j0, first, count)
        return kb.splat(kb.load(mask, kb.dot([b, h, i, 0][4 - len(shape):], step)), LANES)
    column = j0 + first - (t.mask_from if t.mask_from is not None else 0)
    whole = kb.i64(first + LANES) <= count
    if t.mask_from is not None:
        whole = kb.and_(whole, column >= 0)
    result = kb.local(zeros(LANES))
    with kb.b.if_else(whole, likely=True) as (then, otherwise):
        with then:
            at = kb.dot([b, h, i, column][4 - len(shape):], step)
            kb.set(result, kb.vload(mask, at, LANES))
        with otherwise:
            kb.set(result, _mask_lanes(t, b, h, i, j0, first, count))
    return kb.get(result)


def _mask_lanes(t: _Tile, b, h, i, j0, first: int, count):
    """_mask_vector lane by lane."""
    kb = t.kb
    mask, shape, strides = t.mask
    step = [0 if isinstance(n, int) and n == 1 else st
            for n, st in zip(shape, strides, strict=True)]
    vector = zeros(LANES)
    for lane in range(LANES):
        j = kb.index(kb.select(kb.i64(first + lane) < count, j0 + first + lane, j0))
        if t.mask_from is None:
            value = kb.load(mask, kb.dot([b, h, i, j][4 - len(shape):], step))
        else:
            column = j - t.mask_from
            at = kb.dot([b, h, i, kb.smax(column, 0)][4 - len(shape):], step)
            value = kb.select(column < 0, kb.f32(0.0), kb.load(mask, at))
        vector = kb.with_lane(vector, lane, value)
    return vector


def _update_row(t: _Tile, r, at: int):
    """The chunk's row r's maximum and sum after the block's scores t.s[at..] (SUBS
    vectors of LANES, scaled and masked), which become exp(s - m); returns the
    factor its accumulators are rescaled by."""
    kb = t.kb
    s = [kb.vload(t.s, at + sub * LANES, LANES) for sub in range(SUBS)]
    m_old = kb.load(t.m, r)
    top = functools.reduce(lambda a, c: vmax(kb, a, c), s)
    m_new = kb.fmax(m_old, reduce_lanes(kb, top, lambda a, c: vmax(kb, a, c)))
    rescale = kb.exp(kb.fsub(m_old, m_new))
    p = [kb.exp(kb.fsub(v, kb.splat(m_new, LANES))) for v in s]
    for sub in range(SUBS):
        kb.vstore(t.s, at + sub * LANES, p[sub])
    kb.store(t.m, r, m_new)
    total = reduce_lanes(kb, functools.reduce(kb.fadd, p), kb.fadd)
    kb.store(t.l, r, kb.fadd(kb.fmul(kb.load(t.l, r), rescale), total))
    return rescale


def _accumulate(t: _Tile, r0, rescale: list, count, value_at) -> None:
    """acc[r0 + r] = acc[r0 + r] * rescale[r] + sum over the block's valid keys j of
    p[r][j] V[j] (p in t.s; value_at(j, g): group g of V[j], packed or in place): as
    vectors over Dv, one FMA chain per row, each V row loaded once for the tile."""
    kb = t.kb
    rows, groups = len(rescale), t.dvp // t.g
    for g0 in range(0, groups, 2):  # two vectors of Dv a pass: a weight broadcast once
        gs = range(g0, min(g0 + 2, groups))
        accs = {(r, g): kb.local(kb.fmul(kb.vload(t.acc, (r0 + r) * t.dvp + g * t.g, t.g),
                                         kb.splat(rescale[r], t.g)))
                for r, g in itertools.product(range(rows), gs)}
        with kb.loop(0, count, "key") as key:
            values = {g: value_at(key, g) for g in gs}
            for r in range(rows):
                weight = kb.splat(kb.load(t.s, key + r * BLOCK), t.g)
                for g in gs:
                    kb.set(accs[r, g], fma(kb, weight, values[g], kb.get(accs[r, g])))
        for (r, g), acc in accs.items():
            kb.vstore(t.acc, (r0 + r) * t.dvp + g * t.g, kb.get(acc))


def _finish(t: _Tile, b, h, c0, r0, rows: int) -> None:
    """The chunk's output rows r0.. = acc / l, through the output's perm (its Dv
    stride may not be 1)."""
    kb = t.kb
    o0 = b * t.os[0] + h * t.os[1]
    for r in range(rows):
        inv = kb.fdiv(kb.f32(1.0), kb.load(t.l, r0 + r))
        row = o0 + (c0 + r0 + r) * t.os[2]
        for g in range(t.dvp // t.g):
            value = kb.fmul(kb.vload(t.acc, (r0 + r) * t.dvp + g * t.g, t.g),
                            kb.splat(inv, t.g))
            if t.os[3] == 1 and (g + 1) * t.g <= t.dv:
                kb.vstore(t.out, row + g * t.g, value)
                continue
            for lane in range(min(t.g, t.dv - g * t.g)):
                kb.store(t.out, row + (g * t.g + lane) * t.os[3], kb.lane(value, lane))
