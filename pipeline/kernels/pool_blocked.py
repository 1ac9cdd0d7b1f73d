"""Pooling on channel-blocked tensors (NCHW{b}c): one vector holds b channels of a pixel.

max_pool2d_nchwc / avg_pool2d_nchwc take the attributes of max_pool2d / avg_pool2d
(pool.py) and the same output size rule; global_avg_pool_nchwc and
global_max_pool_nchwc give [N, C/b, 1, 1, b].
Taps outside the input are skipped with a select on a clamped, always in-bounds
load, as in the plain pools; work items (image, channel block, output row) are
split over threads band by band, as the convolutions around them (dsl/vector.py).
"""

from __future__ import annotations

import math

import llvmlite.ir as ir

from pipeline.dsl.vector import (
    ELEMENT_WORK,
    apply_epilogue,
    band_items,
    band_plane_row,
    parallel_for,
    vconst,
    vec,
    vmax,
)
from pipeline.kernels.pool import INT8, int8_max
from pipeline.kernels.registry import lowering


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
    with parallel_for(kb, band_items(n_n, cb_n, oh_n), "rows",
                      work=out.type.size * (kh_n * kw_n + ELEMENT_WORK)) as item, \
            band_plane_row(kb, item, n_n, cb_n, oh_n) as (n, cb, oh):
        plane = n * cb_n + cb
        x_plane = plane * (h * w * vb)
        with kb.loop(0, ow_n, "ow") as ow:
            quantized = x.type.dtype in INT8  # a max of quantized bytes (FuseQDQ)
            acc = kb.local(ir.Constant(vec(vb, x.elem), [INT8[x.type.dtype]] * vb)
                           if quantized else ir.Constant(vec(vb), start))
            count = kb.local(kb.f32(0.0))
            for kh in range(kh_n):
                ih = oh * sh + (kh * dh - pt)
                ok_h, pad_h = kb.inside(ih, 0, h), kb.inside(ih, -pt, h + pb)
                row = x_plane + kb.clamp(ih, h) * (w * vb)
                for kw in range(kw_n):
                    iw = ow * sw + (kw * dw - pl)
                    ok = kb.and_(ok_h, kb.inside(iw, 0, w))
                    v = kb.vload(x, row + kb.clamp(iw, w) * vb, vb)
                    old = kb.get(acc)
                    new = (int8_max(kb, x.type.dtype, old, v) if quantized else
                           vmax(kb, old, v)) if is_max else kb.fadd(old, v)
                    kb.set(acc, kb.select(ok, new, old))
                    if not is_max:
                        counted = kb.and_(pad_h, kb.inside(iw, -pl, w + pr)) \
                            if include_pad else ok
                        c = kb.get(count)
                        kb.set(count, kb.select(counted, kb.fadd(c, kb.f32(1.0)), c))
            value = kb.get(acc)
            if not is_max:
                inv = kb.fdiv(kb.f32(1.0), kb.fmax(kb.get(count), kb.f32(1.0)))
                value = kb.fmul(value, kb.splat(inv, vb))
            index = [n, cb, oh, ow, 0]
            value = apply_epilogue(kb, epilogue, value, index)
            kb.vstore(out, kb.dot(index[:4], out.strides[:4]), value)


lowering("max_pool2d_nchwc", lower=_lower)

lowering("avg_pool2d_nchwc", lower=_lower)


def _global_lower(kb, node, ins, out, epilogue):
    """Mean (or max) over H*W of each (image, channel block), b channels per vector."""
    x = ins[0]
    is_max = node.op == "global_max_pool_nchwc"
    n_n, cb_n, h, w, vb = x.type.shape
    with parallel_for(kb, n_n * cb_n, "planes", work=x.type.size * ELEMENT_WORK) as plane:
        base = plane * (h * w * vb)
        acc = kb.local(kb.vload(x, base, vb))
        with kb.loop(1, h * w, "p") as p:
            v = kb.vload(x, base + p * vb, vb)
            kb.set(acc, vmax(kb, kb.get(acc), v) if is_max else kb.fadd(kb.get(acc), v))
        value = kb.get(acc) if is_max else kb.fmul(kb.get(acc), vconst(1.0 / (h * w), vb))
        index = [plane // cb_n, plane % cb_n, 0, 0, 0]
        value = apply_epilogue(kb, epilogue, value, index)
        kb.vstore(out, plane * vb, value)


for _op in ("global_avg_pool_nchwc", "global_max_pool_nchwc"):
    lowering(_op, lower=_global_lower)
