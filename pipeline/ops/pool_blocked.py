"""Pooling on channel-blocked tensors (NCHW{b}c): one vector holds b channels of a pixel.

max_pool2d_nchwc / avg_pool2d_nchwc take the attributes of max_pool2d / avg_pool2d
(pool.py) and the same output size rule; global_avg_pool_nchwc and
global_max_pool_nchwc give [N, C/b, 1, 1, b].
Taps outside the input are skipped with a select on a clamped, always in-bounds
load, as in the plain pools; work items (image, channel block, output row) are
split over threads.
"""

from __future__ import annotations

import math

import llvmlite.ir as ir

from pipeline.dsl.vector import (
    apply_epilogue,
    parallel_for,
    splat,
    vconst,
    vec,
    vload,
    vmax,
    vstore,
)
from pipeline.ir.graph import TensorType
from pipeline.ops.registry import get, register


def _infer(types, node):
    n, cb, h, w, b = types[0].shape
    plain = get(node.op.removesuffix("_nchwc")).infer([TensorType((n, cb * b, h, w),
                                                                  types[0].dtype)], node)[0]
    return [TensorType((n, cb, plain.shape[2], plain.shape[3], b), types[0].dtype)]


def _clamp(kb, v, size):
    b = kb.b
    low = b.select(b.icmp_signed("<", v, kb.i64(0)), kb.i64(0), v)
    return b.select(b.icmp_signed(">=", low, kb.i64(size)), kb.i64(size - 1), low)


def _inside(kb, v, lo, hi):
    b = kb.b
    return b.and_(b.icmp_signed(">=", v, kb.i64(lo)), b.icmp_signed("<", v, kb.i64(hi)))


def _lower(kb, node, ins, out, epilogue):
    x = ins[0]
    is_max = node.op == "max_pool2d_nchwc"
    n_n, cb_n, h, w, vb = x.type.shape
    _, _, oh_n, ow_n, _ = out.type.shape
    (kh_n, kw_n), (sh, sw), (dh, dw) = node.attr("kernel"), node.attr("strides"), \
        node.attr("dilations")
    pt, pl, pb, pr = node.attr("pads")
    include_pad = bool(node.attr("count_include_pad", 0))
    start = [-math.inf if is_max else 0.0] * vb
    with parallel_for(kb, n_n * cb_n * oh_n, "rows") as item:
        b = kb.b
        plane = b.udiv(item, kb.i64(oh_n))          # n * cb_n + cb
        oh = b.urem(item, kb.i64(oh_n))
        x_plane = kb.mul(plane, h * w * vb)
        with kb.loop(0, ow_n, "ow") as ow:
            acc = kb.local(ir.Constant(vec(vb), start))
            count = kb.local(kb.f32(0.0))
            for kh in range(kh_n):
                ih = kb.add(kb.mul(oh, sh), kh * dh - pt)
                ok_h, pad_h = _inside(kb, ih, 0, h), _inside(kb, ih, -pt, h + pb)
                row = kb.add(x_plane, kb.mul(_clamp(kb, ih, h), w * vb))
                for kw in range(kw_n):
                    iw = kb.add(kb.mul(ow, sw), kw * dw - pl)
                    ok = b.and_(ok_h, _inside(kb, iw, 0, w))
                    v = vload(kb, x, kb.add(row, kb.mul(_clamp(kb, iw, w), vb)), vb)
                    old = kb.get(acc)
                    new = vmax(kb, old, v) if is_max else kb.fadd(old, v)
                    kb.set(acc, b.select(ok, new, old))
                    if not is_max:
                        counted = b.and_(pad_h, _inside(kb, iw, -pl, w + pr)) \
                            if include_pad else ok
                        c = kb.get(count)
                        kb.set(count, b.select(counted, kb.fadd(c, kb.f32(1.0)), c))
            value = kb.get(acc)
            if not is_max:
                inv = kb.fdiv(kb.f32(1.0), kb.fmax(kb.get(count), kb.f32(1.0)))
                value = kb.fmul(value, splat(kb, inv, vb))
            index = [b.udiv(plane, kb.i64(cb_n)), b.urem(plane, kb.i64(cb_n)), oh, ow, 0]
            value = apply_epilogue(kb, epilogue, value, index)
            vstore(kb, out, kb.dot(index[:4], out.strides[:4]), value)


register("max_pool2d_nchwc", "anchor", _infer, lower=_lower)
register("avg_pool2d_nchwc", "anchor", _infer, lower=_lower)


def _global_lower(kb, node, ins, out, epilogue):
    """Mean (or max) over H*W of each (image, channel block), b channels per vector."""
    x = ins[0]
    is_max = node.op == "global_max_pool_nchwc"
    n_n, cb_n, h, w, vb = x.type.shape
    with parallel_for(kb, n_n * cb_n, "planes") as plane:
        base = kb.mul(plane, h * w * vb)
        acc = kb.local(vload(kb, x, base, vb))
        with kb.loop(1, h * w, "p") as p:
            v = vload(kb, x, kb.add(base, kb.mul(p, vb)), vb)
            kb.set(acc, vmax(kb, kb.get(acc), v) if is_max else kb.fadd(kb.get(acc), v))
        value = kb.get(acc) if is_max else kb.fmul(kb.get(acc), vconst(1.0 / (h * w), vb))
        index = [kb.b.udiv(plane, kb.i64(cb_n)), kb.b.urem(plane, kb.i64(cb_n)),
                 kb.i64(0), kb.i64(0), 0]
        value = apply_epilogue(kb, epilogue, value, index)
        vstore(kb, out, kb.mul(plane, vb), value)


for _op in ("global_avg_pool_nchwc", "global_max_pool_nchwc"):
    register(_op, "anchor",
             lambda types, node: [TensorType(types[0].shape[:2] + (1, 1, types[0].shape[4]),
                                             types[0].dtype)],
             lower=_global_lower)
