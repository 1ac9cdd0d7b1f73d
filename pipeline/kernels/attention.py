"""The attention kernel: softmax(Q Kᵀ * scale [+ mask]) V, its operands read through
their perms (the operator, its inputs, attributes and layouts: pipeline/ops/attention.py).

Per (b, key head) work item (split over threads): Kᵀ and V are packed into zero-padded
stack panels ([D][Sk'] and [Sk][Dv'], Sk' and Dv' whole vectors) once for the group
of query heads reading them, then R rows of each one's queries at a time get their
scores as vectors over k positions (R independent FMA chains), a vectorised softmax
over each row, and their outputs as vectors over Dv (again R chains). The scores
never leave the stack.
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.dsl.vector import fma, parallel_for, reduce_lanes, vconst, vmax, zeros
from pipeline.errors import ModelError
from pipeline.kernels.attention_dims import lower_attention_dims
from pipeline.kernels.registry import lowering
from pipeline.ops.geometry import ATTENTION_LANES as LANES
from pipeline.ops.geometry import attention_rows as _rows
from pipeline.ops.geometry import logical_shapes


def _lower(kb, node, ins, out, epilogue):
    q, k, v = ins[:3]
    mask = ins[3] if len(ins) > 3 else None
    # FuseAttention makes these for runtime lengths only
    if node.attr("mask_keys", "all") != "all" or node.attr("appended", False):
        raise ModelError(f"node {node.name!r} (attention): mask_keys "
                         f"{node.attr('mask_keys')!r}, appended {node.attr('appended', False)}"
                         " need runtime lengths (executor vm)")
    (bn, hn, sq, d), (_, _, _, sk), (_, _, _, dv) = logical_shapes(
        [t.type.shape for t in ins], node)
    qs, ks, vs = (tuple(buf.strides[p] for p in node.attr(f"{n}_perm"))
                  for buf, n in zip(ins, "qkv", strict=False))
    out_perm = node.attr("out_perm")
    os_ = tuple(out.strides[out_perm.index(u)] for u in range(4))
    skp, dvp = -(-sk // LANES) * LANES, -(-dv // LANES) * LANES
    rows, group = _rows(sq), node.attr("group", 1)
    output = node.attr("output", "y")
    row = _Row(node.attr("scale"), node.attr("softcap", 0.0),
               node.attr("masked_rows", "nan") == "zero", sk, skp)

    # One work item per key head: its panels are packed once for its `group` query heads.
    with parallel_for(kb, bn * (hn // group), "heads",
                      work=bn * hn * sq * sk * (d + dv)) as item:
        b, hk = item // (hn // group), item % (hn // group)
        kt, vp, p = kb.scratch(d * skp), kb.scratch(sk * dvp), kb.scratch(rows * skp)
        k0, v0 = b * ks[0] + hk * ks[1], b * vs[0] + hk * vs[1]
        _pack_panels(kb, k, v, kt, vp, k0, v0, ks, vs, (d, sk, dv, skp, dvp),
                     output == "y")
        with kb.loop(0, group, "g") as g, kb.loop(0, sq // rows, "it") as it:
            h, i0 = hk * group + g, it * rows
            q0, o0 = b * qs[0] + h * qs[1], b * os_[0] + h * os_[1]

            def q_at(r, c):
                return kb.load(q, q0 + (i0 + r) * qs[2] + c * qs[3])

            def scores(jb0, blocks: int) -> None:
                """Scores of the row tile for k positions jb0 * LANES.. (blocks vectors)."""
                accs = _tile_product(kb, rows, blocks, d, q_at, lambda c, g: kb.vload(
                    kt, c * skp + (jb0 + g) * LANES, LANES))
                for r, g in np.ndindex(rows, blocks):
                    kb.vstore(p, r * skp + (jb0 + g) * LANES, accs[r][g])

            _in_pairs(kb, skp // LANES, "jb", scores)
            if output != "y":
                for r in range(rows):
                    _score_row_out(kb, row, p, r * skp, output, mask, [b, h, i0 + r], out,
                                   o0 + (i0 + r) * os_[2], os_[3])
            else:
                _context_rows(kb, row, (p, vp, out), mask, [b, h, i0], rows,
                              o0 + i0 * os_[2], os_, (sk, skp, dv, dvp))


def _context_rows(kb, row, bufs, mask, index: list, rows: int, o, os_, dims) -> None:
    """Softmax of the tile's rows of scores in p, times V (panel vp) into out at o:
    sum_j p[r, j] V[j, c] as vectors over c (rows x 2 independent FMA chains)."""
    p, vp, out = bufs
    sk, skp, dv, dvp = dims
    b, h, i0 = index
    inverse = [row.softmax(kb, p, r * skp, mask, [b, h, i0 + r]) for r in range(rows)]

    def outputs(cb0, blocks: int) -> None:
        accs = _tile_product(kb, rows, blocks, sk, lambda r, j: kb.load(p, r * skp + j),
                             lambda j, g: kb.vload(vp, j * dvp + (cb0 + g) * LANES, LANES))
        for r, g in np.ndindex(rows, blocks):
            c0 = (cb0 + g) * LANES
            value = kb.fmul(accs[r][g], kb.splat(inverse[r], LANES))
            _store_row(kb, out, o + r * os_[2] + c0 * os_[3], os_[3], value, c0, dv)

    _in_pairs(kb, dvp // LANES, "cb", outputs)


def _pack_panels(kb, k, v, kt, vp, k0, v0, ks, vs, dims, with_v: bool) -> None:
    """Kᵀ into kt [D][Sk'] and (with_v) V into vp [Sk][Dv'], zero-padded to whole
    vectors; k position outer, so both copies read along the head dim (contiguous
    when the heads were split by a Transpose)."""
    d, sk, dv, skp, dvp = dims
    zero = kb.f32(0.0)
    with kb.loop(0, sk, "j") as j, kb.loop(0, d, "c") as c:
        kb.store(kt, c * skp + j, kb.load(k, k0 + c * ks[2] + j * ks[3]))
    if skp > sk:
        with kb.loop(0, d, "c") as c, kb.loop(sk, skp, "j") as j:
            kb.store(kt, c * skp + j, zero)
    if not with_v:
        return
    with kb.loop(0, sk, "j") as j:
        with kb.loop(0, dv, "c") as c:
            kb.store(vp, j * dvp + c, kb.load(v, v0 + j * vs[2] + c * vs[3]))
        if dvp > dv:
            with kb.loop(dv, dvp, "c") as c:
                kb.store(vp, j * dvp + c, zero)


def _score_row_out(kb, row, p, at: int, output: str, mask, index: list, out, o, stride):
    """Write one row of scores (output "scores", "biased" or "probs") to out[o + j * stride]."""
    if output == "probs":
        inverse = row.softmax(kb, p, at, mask, index)
    else:
        row.bias(kb, p, at, mask if output == "biased" else None, index)
        inverse = kb.f32(1.0)
    with kb.loop(0, row.sk, "j") as j:
        kb.store(out, o + j * stride, kb.fmul(kb.load(p, at + j), inverse))


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


class _Row:
    """One row of scores in the stack panel p: scale, softcap and mask, then softmax."""

    def __init__(self, scale: float, softcap: float, zero_masked: bool, sk: int, skp: int):
        self.scale, self.softcap, self.zero_masked = scale, softcap, zero_masked
        self.sk, self.skp = sk, skp

    def _score(self, kb, s, mask_value):
        """s * scale, softcapped, plus the mask value (vectors or scalars alike)."""
        s = kb.fmul(s, kb.fconst(self.scale, s))
        if self.softcap > 0:
            s = kb.fmul(_tanh(kb, kb.fmul(s, kb.fconst(1.0 / self.softcap, s))),
                        kb.fconst(self.softcap, s))
        return s if mask_value is None else kb.fadd(s, mask_value)

    def bias(self, kb, p, row, mask, index: list):
        """p[row:row + sk] = its score (scale, softcap, mask) in place, the padding to
        skp -inf; returns the row maximum. Whole vectors where the mask has them."""
        sk, skp = self.sk, self.skp
        full = sk // LANES
        peak = kb.local(vconst(-math.inf, LANES))
        with kb.loop(0, full, "jb") as jb:
            at = row + jb * LANES
            s = self._score(kb, kb.vload(p, at, LANES), None if mask is None else
                            kb.load_broadcast(mask, [*index, jb * LANES], LANES))
            kb.vstore(p, at, s)
            kb.set(peak, vmax(kb, kb.get(peak), s))
        if skp > sk:  # the last, partial vector: scalar, then padded with -inf
            with kb.loop(full * LANES, sk, "j") as j:
                s = self._score(kb, kb.load(p, row + j), None if mask is None else
                                kb.load_broadcast(mask, [*index, j]))
                kb.store(p, row + j, s)
            with kb.loop(sk, skp, "j") as j:
                kb.store(p, row + j, kb.f32(-math.inf))
            kb.set(peak, vmax(kb, kb.get(peak), kb.vload(p, row + full * LANES, LANES)))
        return reduce_lanes(kb, kb.get(peak), lambda a, b: vmax(kb, a, b))

    def softmax(self, kb, p, row, mask, index: list):
        """p[row:row + skp] = exp(score - max) in place (the padding becomes 0); returns
        1 / their sum (0 for a row masked whole when zero_masked, else NaN there)."""
        top = self.bias(kb, p, row, mask, index)
        if self.zero_masked:  # all -inf: exp(-inf - 0) = 0 everywhere, not NaN
            top = kb.select(kb.compare("==", top, kb.f32(-math.inf)), kb.f32(0.0), top)
        total = kb.local(zeros(LANES))
        with kb.loop(0, self.skp // LANES, "jb") as jb:
            at = row + jb * LANES
            e = kb.exp(kb.fsub(kb.vload(p, at, LANES), kb.splat(top, LANES)))
            kb.vstore(p, at, e)
            kb.set(total, kb.fadd(kb.get(total), e))
        total = reduce_lanes(kb, kb.get(total), kb.fadd)
        inverse = kb.fdiv(kb.f32(1.0), total)
        if self.zero_masked:
            inverse = kb.select(kb.compare("==", total, kb.f32(0.0)), kb.f32(0.0), inverse)
        return inverse


def _tanh(kb, x):
    """tanh(x) = sign(x) (1 - e) / (1 + e), e = exp(-2|x|): no cancellation, vectorises."""
    e = kb.exp(kb.fmul(kb.intrinsic("fabs", x), kb.fconst(-2.0, x)))
    one = kb.fconst(1.0, x)
    return kb.intrinsic("copysign", kb.fdiv(kb.fsub(one, e), kb.fadd(one, e)), x)


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


def _rotary_lower(kb, node, ins, out, epilogue):
    """Row by row of x (split over threads): R/2 rotated pairs, then the copied tail."""
    x, cos, sin = ins
    shape = x.type.shape
    half, d = cos.type.shape[-1], shape[-1]
    rows = shape[:-1]
    pairs = (lambda j: (j * 2, j * 2 + 1)) if node.attr("interleaved") else \
        (lambda j: (j, j + half))
    with parallel_for(kb, math.prod(rows), "r", work=4 * x.type.size) as r:
        outer = kb.unflatten(r, rows)
        xb, ob = kb.dot(outer, x.strides[:-1]), kb.dot(outer, out.strides[:-1])
        with kb.loop(0, half, "j") as j:
            c = kb.load_broadcast(cos, [*outer, j])
            s = kb.load_broadcast(sin, [*outer, j])
            i1, i2 = pairs(j)
            x1 = kb.load(x, xb + i1 * x.strides[-1])
            x2 = kb.load(x, xb + i2 * x.strides[-1])
            kb.store(out, ob + i1 * out.strides[-1], kb.fsub(kb.fmul(c, x1), kb.fmul(s, x2)))
            kb.store(out, ob + i2 * out.strides[-1], kb.fadd(kb.fmul(s, x1), kb.fmul(c, x2)))
        if d > 2 * half:
            with kb.loop(2 * half, d, "j") as j:
                kb.store(out, ob + j * out.strides[-1], kb.load(x, xb + j * x.strides[-1]))


lowering("rotary_embedding", lower=_rotary_lower)


def _linear_lower(kb, node, ins, out, epilogue):
    """Per (batch, key head) work item: the state on the stack, time steps in order."""
    q, k, v, state = ins[:4]
    rest = list(ins[4:])
    decay = rest.pop(0) if node.attr("gated") else None
    beta = rest.pop(0) if node.attr("delta") else None
    (bn, steps, qw), hkv = q.type.shape, state.type.shape[1]
    dk, dv = state.type.shape[2:]
    group = node.attr("q_heads") // hkv
    with parallel_for(kb, bn * hkv, "heads", work=bn * steps * hkv * dk * dv * (3 + group)) \
            as item:
        b, hk = item // hkv, item % hkv
        st, u = kb.scratch(dk * dv), kb.scratch(dv)
        with kb.loop(0, dk * dv, "e") as e:
            kb.store(st, e, kb.load(state, b * (hkv * dk * dv) + hk * (dk * dv) + e))
        with kb.loop(0, steps, "t") as t:
            at = b * steps + t  # row (b, t) of the [B, T, width] operands
            if decay is not None:
                per_feature = decay.type.shape[2] != hkv
                with kb.loop(0, dk, "c") as c:
                    g = kb.exp(kb.load(decay, at * decay.type.shape[2] +
                                       (hk * dk + c if per_feature else hk)))
                    with kb.loop(0, dv, "m") as m:
                        kb.store(st, c * dv + m, kb.fmul(kb.load(st, c * dv + m), g))
            _linear_step(kb, (k, v, beta), st, u, at, hk, (dk, dv))
            if node.attr("output") == "y":
                with kb.loop(0, group, "g") as g, kb.loop(0, dv, "m") as m:
                    h = hk * group + g
                    acc = kb.local(kb.f32(0.0))
                    with kb.loop(0, dk, "c") as c:
                        kb.set(acc, kb.fadd(kb.get(acc), kb.fmul(
                            kb.load(q, at * qw + h * dk + c), kb.load(st, c * dv + m))))
                    kb.store(out, at * (qw // dk * dv) + h * dv + m,
                             kb.fmul(kb.get(acc), kb.f32(node.attr("scale"))))
        if node.attr("output") == "state":
            with kb.loop(0, dk * dv, "e") as e:
                kb.store(out, b * (hkv * dk * dv) + hk * (dk * dv) + e, kb.load(st, e))


def _linear_step(kb, operands, st, u, at, hk, dims) -> None:
    """u = v_t, or beta (v_t - Sᵀ k_t) (delta rule); then S += k_t uᵀ."""
    k, v, beta = operands
    dk, dv = dims
    kw, vw = k.type.shape[2], v.type.shape[2]
    with kb.loop(0, dv, "m") as m:
        value = kb.load(v, at * vw + hk * dv + m)
        if beta is not None:
            acc = kb.local(kb.f32(0.0))
            with kb.loop(0, dk, "c") as c:
                kb.set(acc, kb.fadd(kb.get(acc), kb.fmul(kb.load(st, c * dv + m),
                                                         kb.load(k, at * kw + hk * dk + c))))
            width = beta.type.shape[2]
            weight = kb.load(beta, at * width + (hk if width != 1 else 0))
            value = kb.fmul(weight, kb.fsub(value, kb.get(acc)))
        kb.store(u, m, value)
    with kb.loop(0, dk, "c") as c:
        key = kb.load(k, at * kw + hk * dk + c)
        with kb.loop(0, dv, "m") as m:
            kb.store(st, c * dv + m, kb.fadd(kb.load(st, c * dv + m),
                                             kb.fmul(key, kb.load(u, m))))


lowering("linear_attention", lower=_linear_lower)
