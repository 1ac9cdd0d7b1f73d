"""depthwise_conv2d_nchwc: a depthwise convolution (one filter per channel) on
channel-blocked tensors.

Layouts (b = the target's vector width):
  x    [N, C/b, H, W, b]     w [C/b, KH, KW, b] (packed at build time)
  bias [C] (optional)        out [N, C/b, OH, OW, b]

Channels are independent, so one vector holds b channels of one pixel and every
tap is a vector multiply-add of input pixel and weight vector, no broadcasts. A
register tile holds T output columns of one row; work items (image, channel
block, output row) are split over threads. Padding is handled as in
conv2d_nchwc: the kh range is clamped per row, border tiles leave out their
out-of-range kw taps, tiles inside the row run in a loop.
"""

from __future__ import annotations

from pipeline.dsl.vector import apply_epilogue, fma, parallel_for, vload, vstore, zeros
from pipeline.errors import ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.conv_blocked import registers, row_plan, smax, smin
from pipeline.ops.registry import register


def _infer(types, node):
    x, w = types[0], types[1]
    n, cb, h, wd, b = x.shape
    if w.shape[0] != cb or w.shape[3] != b:
        raise ModelError(f"node {node.name!r} (depthwise_conv2d_nchwc): weights "
                         f"{list(w.shape)} do not match input {list(x.shape)}")
    _, kh, kw, _ = w.shape
    (sh, sw), (pt, pl, pb, pr) = node.attr("strides"), node.attr("pads")
    return [TensorType((n, cb, (h + pt + pb - kh) // sh + 1, (wd + pl + pr - kw) // sw + 1, b),
                       x.dtype)]


def pack_depthwise_weight(weight, block: int):
    """[C, 1, KH, KW] -> [C/block, KH, KW, block]."""
    c, _, kh, kw = weight.shape
    return weight.reshape(c // block, block, kh, kw).transpose(0, 2, 3, 1).copy()


def _lower(kb, node, ins, out, epilogue):
    x, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    n_n, cb_n, h, wd, vb = x.type.shape
    _, kh_n, kw_n, _ = w.type.shape
    _, _, oh_n, ow_n, _ = out.type.shape
    (sh, sw), (pt, pl, _, _) = node.attr("strides"), node.attr("pads")
    widest = registers(vb) - 4  # accumulators; the rest: input, weight, spare
    t = -(-ow_n // -(-ow_n // widest))
    plan = row_plan(ow_n, t, -(-pl // sw), (wd - 1 + pl - (kw_n - 1)) // sw)
    with parallel_for(kb, n_n * cb_n * oh_n, "rows") as item:
        b = kb.b
        plane = b.udiv(item, kb.i64(oh_n))                 # n * cb_n + cb
        oh = b.urem(item, kb.i64(oh_n))
        cb = b.urem(plane, kb.i64(cb_n))
        ih0 = b.sub(b.mul(oh, kb.i64(sh)), kb.i64(pt))
        kh_lo, kh_hi = smax(kb, b.neg(ih0), kb.i64(0)), smin(kb, b.sub(kb.i64(h), ih0),
                                                             kb.i64(kh_n))
        init = vload(kb, bias, kb.mul(cb, vb), vb) if bias else zeros(vb)
        x_plane = kb.mul(plane, h * wd * vb)
        w_plane = kb.mul(cb, kh_n * kw_n * vb)

        def tile(ow0, width):
            accs = [kb.local(init) for _ in range(width)]
            with kb.loop(kh_lo, kh_hi, "kh") as kh:
                x_row = kb.add(x_plane, kb.mul(kb.add(ih0, kh), wd * vb))
                w_row = kb.add(w_plane, kb.mul(kh, kw_n * vb))
                for kw in range(kw_n):
                    wv = vload(kb, w, kb.add(w_row, kw * vb), vb)
                    for j in range(width):
                        if isinstance(ow0, int) and not 0 <= (ow0 + j) * sw - pl + kw < wd:
                            continue
                        iw = kb.add(kb.mul(kb.add(ow0, j), sw), kw - pl)
                        xv = vload(kb, x, kb.add(x_row, kb.mul(iw, vb)), vb)
                        kb.set(accs[j], fma(kb, xv, wv, kb.get(accs[j])))
            for j in range(width):
                index = [b.udiv(plane, kb.i64(cb_n)), cb, oh, kb.add(ow0, j), 0]
                value = apply_epilogue(kb, epilogue, kb.get(accs[j]), index)
                vstore(kb, out, kb.dot(index[:4], out.strides[:4]), value)

        for entry in plan:
            if entry[0] == "static":
                tile(entry[1], entry[2])
                continue
            _, start, count = entry
            with kb.loop(0, count, "tile") as j:
                tile(kb.b.add(kb.i64(start), kb.b.mul(j, kb.i64(t))), t)


register("depthwise_conv2d_nchwc", "anchor", _infer, lower=_lower)
