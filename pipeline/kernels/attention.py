"""attention: softmax(Q Kᵀ * scale [+ mask]) V in one kernel (made by FuseAttention,
pipeline/transform/attention.py, from the MatMul, Div/Mul, Add, Softmax, MatMul
chain exporters write).

Inputs q, k, v [, mask]; each of q, k, v is read in its own memory layout
through a permutation (`q_perm`, `k_perm`, `v_perm`: logical dim t is the
operand's dim perm[t]), so the head-splitting Transposes before the products
are never materialised; the logical operands are Q [B, H, Sq, D],
Kᵀ [B, H, D, Sk] and V [B, H, Sk, Dv]. The result [B, H, Sq, Dv] is written
through `out_perm` (the output's dim t is logical dim out_perm[t]), so the
Transpose that merges the heads again is not materialised either. mask
broadcasts to [B, H, Sq, Sk] (numpy rules) and is added after the scale.

Per (b, h) work item (split over threads): Kᵀ and V are packed into zero-padded
stack panels ([D][Sk'] and [Sk][Dv'], Sk' and Dv' whole vectors), then R rows of
queries at a time get their scores as vectors over k positions (R independent
FMA chains), a vectorised softmax over each row, and their outputs as vectors
over Dv (again R chains). The scores never leave the stack.
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.dsl.vector import fma, parallel_for, reduce_lanes, vconst, vmax, zeros
from pipeline.kernels.attention_dims import lower_attention_dims
from pipeline.kernels.registry import lowering
from pipeline.ops.geometry import logical_shapes

LANES = 16


# Largest stack panels (floats) a work item may use: Kᵀ, V and R rows of scores.
MAX_PANEL_FLOATS = 1 << 16  # 256 KiB of a thread's stack


def panel_floats(sq: int, d: int, sk: int, dv: int) -> int:
    """Stack floats one work item uses (see MAX_PANEL_FLOATS)."""
    skp, dvp = -(-sk // LANES) * LANES, -(-dv // LANES) * LANES
    return d * skp + sk * dvp + _rows(sq) * skp


def _rows(sq: int) -> int:
    """Query rows per tile: 4 x 2 vectors of accumulators (AVX2's 16 registers too)."""
    return next(r for r in (4, 2, 1) if sq % r == 0)


def _lower(kb, node, ins, out, epilogue):
    q, k, v = ins[:3]
    mask = ins[3] if len(ins) > 3 else None
    (bn, hn, sq, d), (_, _, _, sk), (_, _, _, dv) = logical_shapes(
        [t.type.shape for t in ins], node)
    qs, ks, vs = (tuple(buf.strides[p] for p in node.attr(f"{n}_perm"))
                  for buf, n in zip(ins, "qkv", strict=False))
    out_perm = node.attr("out_perm")
    os_ = tuple(out.strides[out_perm.index(u)] for u in range(4))
    skp, dvp = -(-sk // LANES) * LANES, -(-dv // LANES) * LANES
    rows, scale, zero = _rows(sq), node.attr("scale"), kb.f32(0.0)

    def splat(x):
        return kb.splat(x, LANES)

    with parallel_for(kb, bn * hn, "heads", work=bn * hn * sq * sk * (d + dv)) as item:
        b, h = item // hn, item % hn
        kt, vp, p = kb.scratch(d * skp), kb.scratch(sk * dvp), kb.scratch(rows * skp)
        q0, k0, v0, o0 = (b * s[0] + h * s[1] for s in (qs, ks, vs, os_))
        # Panels, zero-padded to whole vectors; k position outer, so both copies read
        # along the head dim (contiguous when the heads were split by a Transpose).
        with kb.loop(0, sk, "j") as j, kb.loop(0, d, "c") as c:
            kb.store(kt, c * skp + j, kb.load(k, k0 + c * ks[2] + j * ks[3]))
        if skp > sk:
            with kb.loop(0, d, "c") as c, kb.loop(sk, skp, "j") as j:
                kb.store(kt, c * skp + j, zero)
        with kb.loop(0, sk, "j") as j:
            with kb.loop(0, dv, "c") as c:
                kb.store(vp, j * dvp + c, kb.load(v, v0 + j * vs[2] + c * vs[3]))
            if dvp > dv:
                with kb.loop(dv, dvp, "c") as c:
                    kb.store(vp, j * dvp + c, zero)
        with kb.loop(0, sq // rows, "it") as it:
            i0 = it * rows

            def q_at(r, c):
                return kb.load(q, q0 + (i0 + r) * qs[2] + c * qs[3])

            def scores(jb0, blocks: int) -> None:
                """Scores of the row tile for k positions jb0 * LANES.. (blocks vectors)."""
                accs = _tile_product(kb, rows, blocks, d, q_at, lambda c, g: kb.vload(
                    kt, c * skp + (jb0 + g) * LANES, LANES))
                for r, g in np.ndindex(rows, blocks):
                    kb.vstore(p, r * skp + (jb0 + g) * LANES, accs[r][g])

            _in_pairs(kb, skp // LANES, "jb", scores)
            inverse = [_softmax_row(kb, p, r * skp, sk, skp, scale, mask, [b, h, i0 + r])
                       for r in range(rows)]

            def outputs(cb0, blocks: int) -> None:
                """sum_j p[r, j] V[j, c] for c in cb0 * LANES.. (blocks vectors)."""
                accs = _tile_product(kb, rows, blocks, sk,
                                     lambda r, j: kb.load(p, r * skp + j),
                                     lambda j, g: kb.vload(vp, j * dvp + (cb0 + g) * LANES,
                                                           LANES))
                for r, g in np.ndindex(rows, blocks):
                    c0 = (cb0 + g) * LANES
                    value = kb.fmul(accs[r][g], splat(inverse[r]))
                    _store_row(kb, out, o0 + (i0 + r) * os_[2] + c0 * os_[3], os_[3], value,
                               c0, dv)

            _in_pairs(kb, dvp // LANES, "cb", outputs)


def _in_pairs(kb, n: int, name: str, emit) -> None:
    """emit(i0, 2) for the pairs of 0..n, then emit(n - 1, 1) if n is odd."""
    if n >= 2:
        with kb.loop(0, n // 2, name) as i:
            emit(i * 2, 2)
    if n % 2:
        emit(n - 1, 1)


def _tile_product(kb, rows: int, blocks: int, length: int, load_a, load_b) -> list:
    """[r][g] = sum over t < length of load_a(r, t) * load_b(t, g): rows x blocks
    vector accumulators (independent FMA chains), each B vector loaded once a step."""
    accs = [[kb.local(zeros(LANES)) for _ in range(blocks)] for _ in range(rows)]
    with kb.loop(0, length, "t") as t:
        bs = [load_b(t, g) for g in range(blocks)]
        for r in range(rows):
            a = kb.splat(load_a(r, t), LANES)
            for g in range(blocks):
                kb.set(accs[r][g], fma(kb, a, bs[g], kb.get(accs[r][g])))
    return [[kb.get(acc) for acc in row] for row in accs]


def _softmax_row(kb, p, row, sk: int, skp: int, scale: float, mask, index: list):
    """p[row:row + sk] = exp(s * scale [+ mask] - max) in place (the padding to skp
    becomes 0); returns 1 / their sum. Whole vectors where the mask has them."""
    full = sk // LANES
    peak = kb.local(vconst(-math.inf, LANES))
    with kb.loop(0, full, "jb") as jb:
        at = row + jb * LANES
        s = kb.fmul(kb.vload(p, at, LANES), vconst(scale, LANES))
        if mask is not None:
            s = kb.fadd(s, kb.load_broadcast(mask, [*index, jb * LANES], LANES))
        kb.vstore(p, at, s)
        kb.set(peak, vmax(kb, kb.get(peak), s))
    if skp > sk:  # the last, partial vector: scalar, then padded with -inf
        with kb.loop(full * LANES, sk, "j") as j:
            s = kb.fmul(kb.load(p, row + j), kb.f32(scale))
            if mask is not None:
                s = kb.fadd(s, kb.load_broadcast(mask, [*index, j]))
            kb.store(p, row + j, s)
        with kb.loop(sk, skp, "j") as j:
            kb.store(p, row + j, kb.f32(-math.inf))
        kb.set(peak, vmax(kb, kb.get(peak), kb.vload(p, row + full * LANES, LANES)))
    top = reduce_lanes(kb, kb.get(peak), lambda a, b: vmax(kb, a, b))
    total = kb.local(zeros(LANES))
    with kb.loop(0, skp // LANES, "jb") as jb:
        at = row + jb * LANES
        e = kb.exp(kb.fsub(kb.vload(p, at, LANES), kb.splat(top, LANES)))
        kb.vstore(p, at, e)
        kb.set(total, kb.fadd(kb.get(total), e))
    return kb.fdiv(kb.f32(1.0), reduce_lanes(kb, kb.get(total), kb.fadd))


def _store_row(kb, out, at, stride: int, value, c0, dv: int) -> None:
    """Outputs c0 .. c0 + LANES (those below dv) of one row, `stride` apart."""
    if stride == 1 and dv % LANES == 0:
        kb.vstore(out, at, value)
        return
    for lane in range(LANES):
        inside = c0 + lane < dv  # a bool when c0 is known at build time
        if inside is True:
            kb.store(out, at + lane * stride, kb.lane(value, lane))
        elif inside is not False:
            with kb.if_(inside):
                kb.store(out, at + lane * stride, kb.lane(value, lane))


lowering("attention", lower=_lower, lower_dims=lower_attention_dims)
