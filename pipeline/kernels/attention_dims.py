"""attention with runtime sequence lengths (docs/vm.md, "Symbolic dimensions"): the
lowering of an attention kernel whose Sq and Sk are symbolic, which a kernel over
symbolic rows cannot compute (the scores run along Sk).

An online softmax, flash-attention style, so nothing is sized by the sequence
length: per (batch, head), query rows in tiles of ROWS; for each block of LANES keys
the block's Kᵀ and V are packed into stack panels ([D][LANES] and [LANES][Dv']),
the tile's scores are LANES-wide vectors (ROWS independent FMA chains over D), then
per row the running maximum m and sum l, the accumulator of Dv' floats rescaled by
exp(m_old - m) when the maximum grows, and the block's exp(s - m) times V added. The
last, partial block reads its valid keys only (the others' scores are -inf). Rows
are divided by l at the end. The heads (a static count) are split over the thread
team; each body re-reads the runtime dimensions in its own function (dsl/dims.py).
"""

from __future__ import annotations

import contextlib

import llvmlite.ir as ir

from pipeline.dsl.types import F32
from pipeline.dsl.vector import fma, parallel_for, reduce_lanes, vconst, vmax, zeros
from pipeline.errors import ModelError
from pipeline.ir.graph import row_major_strides
from pipeline.ops.geometry import logical_shapes

LANES = 16  # keys per block (one vector of scores)
ROWS = 4    # query rows per tile (independent FMA chains)
# The work a head stands for when the team is sized (the runtime lengths are unknown
# at build time: enough for every thread to take part).
WORK_PER_HEAD = 1 << 20


def lower_attention_dims(kb, node, ins, out, epilogue=None, shapes=None) -> None:
    """out = softmax(Q Kᵀ * scale [+ mask]) V for the operands in their perms
    (pipeline/kernels/attention.py); shapes may hold Index values (the head sizes D
    and Dv are static: FuseAttention leaves symbolic ones alone). (FuseOps never
    gives attention an epilogue: it is opaque.)"""
    assert epilogue is None, "attention has no epilogue"
    # The converters' extras (kernels/attention.py) have no runtime-length form yet.
    extras = {"group": 1, "softcap": 0.0, "masked_rows": "nan", "output": "y"}
    unsupported = [k for k, d in extras.items() if node.attr(k, d) != d]
    if unsupported:
        raise ModelError(f"node {node.name!r} (attention): {', '.join(unsupported)} with "
                         "runtime lengths is not supported yet")
    (_, hn, _, _), _, _ = logical_shapes([t.type.shape for t in ins], node)
    if not isinstance(hn, int) or shapes is None:
        _attention(kb, node, ins, out, [t.type for t in (*ins, out)], None)
        return
    with parallel_for(kb, hn, "heads", work=hn * WORK_PER_HEAD) as h:
        _attention(kb, node, ins, out, shapes(), h)


class _Tile:
    """What the loops of one (batch, head) share: operands, strides, panels, state."""

    def __init__(self, kb, node, ins, out, types):
        self.kb, self.ins, self.out = kb, ins, out
        (self.bn, self.hn, self.sq, self.d), (_, _, _, self.sk), (_, _, _, self.dv) = \
            logical_shapes([t.shape for t in types[:3]], node)
        strides = [row_major_strides(t.shape) for t in types]
        self.qs, self.ks, self.vs = (tuple(strides[n][p] for p in node.attr(f"{name}_perm"))
                                     for n, name in enumerate("qkv"))
        out_perm = node.attr("out_perm")
        self.os = tuple(strides[-1][out_perm.index(u)] for u in range(4))
        self.mask = (ins[3], types[3].shape, strides[3]) if len(ins) > 3 else None
        self.scale = node.attr("scale")
        self.dvp = -(-self.dv // LANES) * LANES
        self.kt, self.vp = kb.scratch(self.d * LANES), kb.scratch(LANES * self.dvp)
        self.acc = kb.scratch(ROWS * self.dvp)
        self.m = [kb.local(kb.f32(0.0)) for _ in range(ROWS)]
        self.l = [kb.local(kb.f32(0.0)) for _ in range(ROWS)]


def _attention(kb, node, ins, out, types, head) -> None:
    """Every head, or `head` alone; types: the buffers' types with Index shapes valid
    in the function being built."""
    t = _Tile(kb, node, ins, out, types)
    with kb.loop(0, LANES * t.dvp, "z") as z:  # V's padding lanes stay 0
        kb.store(t.vp, z, kb.f32(0.0))
    heads = kb.loop(0, t.hn, "h") if head is None else contextlib.nullcontext(head)
    with kb.loop(0, t.bn, "b") as b, heads as h:
        whole = t.sq // ROWS * ROWS
        with kb.loop(0, t.sq // ROWS, "it") as it:
            _query_tile(t, b, h, it * ROWS, ROWS)
        with kb.loop(whole, t.sq, "ir") as i:
            _query_tile(t, b, h, i, 1)


def _query_tile(t: _Tile, b, h, i0, rows: int) -> None:
    kb = t.kb
    for r in range(rows):
        kb.set(t.m[r], kb.f32(-3.0e38))
        kb.set(t.l[r], kb.f32(0.0))
        for g in range(t.dvp // LANES):
            kb.vstore(t.acc, r * t.dvp + g * LANES, zeros(LANES))
    with kb.loop(0, (t.sk + (LANES - 1)) // LANES, "jb") as jb:
        j0 = jb * LANES
        count = kb.smin(t.sk - j0, LANES)  # the block's valid keys
        _pack(t, b, h, j0, count)
        scores = _scores(t, b, h, i0, rows)
        valid = kb.b.fcmp_ordered("<", ir.Constant(ir.VectorType(F32, LANES),
                                                   [float(n) for n in range(LANES)]),
                                  kb.splat(kb.b.sitofp(count.value, F32), LANES))
        for r in range(rows):
            s = kb.fmul(scores[r], vconst(t.scale, LANES))
            if t.mask is not None:
                s = kb.fadd(s, _mask_vector(t, b, h, i0 + r, j0, count))
            s = kb.b.select(valid, s, vconst(-3.0e38, LANES))
            _update_row(t, r, s)
    _finish(t, b, h, i0, rows)


def _pack(t: _Tile, b, h, j0, count) -> None:
    """kt[c][lane] = K[j0 + lane][c], vp[lane][e] = V[j0 + lane][e]; a lane past the
    valid keys reads key j0 (a finite value its -inf score makes weigh 0)."""
    kb = t.kb
    k0, v0 = b * t.ks[0] + h * t.ks[1], b * t.vs[0] + h * t.vs[1]
    with kb.loop(0, LANES, "lane") as lane:
        j = kb.index(kb.select(lane < count, j0 + lane, j0))
        with kb.loop(0, t.d, "c") as c:
            kb.store(t.kt, c * LANES + lane, kb.load(t.ins[1], k0 + c * t.ks[2] + j * t.ks[3]))
        with kb.loop(0, t.dv, "e") as e:
            kb.store(t.vp, lane * t.dvp + e, kb.load(t.ins[2], v0 + j * t.vs[2] + e * t.vs[3]))


def _scores(t: _Tile, b, h, i0, rows: int) -> list:
    """Per row of the tile, the LANES scores q·k of the packed block (unscaled)."""
    kb = t.kb
    q0 = b * t.qs[0] + h * t.qs[1]
    accs = [kb.local(zeros(LANES)) for _ in range(rows)]
    with kb.loop(0, t.d, "c") as c:
        keys = kb.vload(t.kt, c * LANES, LANES)
        for r in range(rows):
            qv = kb.splat(kb.load(t.ins[0], q0 + (i0 + r) * t.qs[2] + c * t.qs[3]), LANES)
            kb.set(accs[r], fma(kb, qv, keys, kb.get(accs[r])))
    return [kb.get(a) for a in accs]


def _mask_vector(t: _Tile, b, h, i, j0, count):
    """The mask (broadcast to [B, H, Sq, Sk]) for keys j0.., lanes past `count` 0."""
    kb = t.kb
    mask, shape, strides = t.mask
    step = [0 if isinstance(n, int) and n == 1 else st
            for n, st in zip(shape, strides, strict=True)]
    vector = zeros(LANES)
    for lane in range(LANES):
        j = kb.index(kb.select(kb.i64(lane) < count, j0 + lane, j0))
        at = kb.dot([b, h, i, j][4 - len(shape):], step)
        vector = kb.with_lane(vector, lane, kb.load(mask, at))
    return vector


def _update_row(t: _Tile, r: int, s) -> None:
    """Row r's state after the block's scores s (LANES, scaled and masked)."""
    kb = t.kb
    m_old = kb.get(t.m[r])
    m_new = kb.fmax(m_old, reduce_lanes(kb, s, lambda a, c: vmax(kb, a, c)))
    rescale = kb.exp(kb.fsub(m_old, m_new))
    p = kb.exp(kb.fsub(s, kb.splat(m_new, LANES)))
    kb.set(t.m[r], m_new)
    kb.set(t.l[r], kb.fadd(kb.fmul(kb.get(t.l[r]), rescale), reduce_lanes(kb, p, kb.fadd)))
    for g in range(t.dvp // LANES):
        at = r * t.dvp + g * LANES
        acc = kb.fmul(kb.vload(t.acc, at, LANES), kb.splat(rescale, LANES))
        for lane in range(LANES):
            acc = fma(kb, kb.splat(kb.lane(p, lane), LANES),
                      kb.vload(t.vp, lane * t.dvp + g * LANES, LANES), acc)
        kb.vstore(t.acc, at, acc)


def _finish(t: _Tile, b, h, i0, rows: int) -> None:
    """out rows = acc / l, through the output's perm (its Dv stride may not be 1)."""
    kb = t.kb
    o0 = b * t.os[0] + h * t.os[1]
    for r in range(rows):
        inv = kb.fdiv(kb.f32(1.0), kb.get(t.l[r]))
        row = o0 + (i0 + r) * t.os[2]
        for g in range(t.dvp // LANES):
            value = kb.fmul(kb.vload(t.acc, r * t.dvp + g * LANES, LANES), kb.splat(inv, LANES))
            if t.os[3] == 1 and (g + 1) * LANES <= t.dv:
                kb.vstore(t.out, row + g * LANES, value)
                continue
            for lane in range(min(LANES, t.dv - g * LANES)):
                kb.store(t.out, row + (g * LANES + lane) * t.os[3], kb.lane(value, lane))
