"""depthwise_conv2d_nchwc: a depthwise convolution (one filter per channel) on
channel-blocked tensors.

Layouts (b = the target's vector width):
  x    [N, C/b, H, W, b]     w [C/b, KH, KW, b] (packed at build time)
  bias [C] (optional)        out [N, C/b, OH, OW, b]

Channels are independent, so one vector holds b channels of one pixel and every
tap is a vector multiply-add of input pixel and weight vector, no broadcasts. A
register tile holds T output columns of one row; work items (image, channel
block, output row) are split over threads band by band (dsl/vector.py, BANDS).
Padding is handled as in conv2d_nchwc: the kh range is clamped per row, border tiles
leave out their out-of-range kw taps, tiles inside the row run in a loop.
"""

from __future__ import annotations

from pipeline.dsl.vector import apply_epilogue, band_items, band_plane_row, fma, parallel_for, zeros
from pipeline.kernels.conv_blocked import registers, row_plan
from pipeline.kernels.registry import lowering


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
    with parallel_for(kb, band_items(n_n, cb_n, oh_n), "rows",
                      work=out.type.size * kh_n * kw_n) as item, \
            band_plane_row(kb, item, n_n, cb_n, oh_n) as (n, cb, oh):
        plane = n * cb_n + cb
        ih0 = oh * sh - pt
        kh_lo, kh_hi = kb.smax(-ih0, 0), kb.smin(h - ih0, kh_n)
        init = kb.vload(bias, cb * vb, vb) if bias else zeros(vb)
        x_plane = plane * (h * wd * vb)
        w_plane = cb * (kh_n * kw_n * vb)

        def tile(ow0, width):
            accs = [kb.local(init) for _ in range(width)]
            with kb.loop(kh_lo, kh_hi, "kh") as kh:
                x_row = x_plane + (ih0 + kh) * (wd * vb)
                w_row = w_plane + kh * (kw_n * vb)
                for kw in range(kw_n):
                    wv = kb.vload(w, w_row + kw * vb, vb)
                    for j in range(width):
                        if isinstance(ow0, int) and not 0 <= (ow0 + j) * sw - pl + kw < wd:
                            continue
                        iw = (ow0 + j) * sw + (kw - pl)
                        xv = kb.vload(x, x_row + iw * vb, vb)
                        kb.set(accs[j], fma(kb, xv, wv, kb.get(accs[j])))
            for j in range(width):
                index = [n, cb, oh, ow0 + j, 0]
                value = apply_epilogue(kb, epilogue, kb.get(accs[j]), index)
                kb.vstore(out, kb.dot(index[:4], out.strides[:4]), value)

        for entry in plan:
            if entry[0] == "static":
                tile(entry[1], entry[2])
                continue
            _, start, count = entry
            with kb.loop(0, count, "tile") as j:
                tile(start + j * t, t)


lowering("depthwise_conv2d_nchwc", lower=_lower)
