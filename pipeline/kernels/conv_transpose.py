"""Transposed convolution: ConvTranspose, 2-D (NCHW), 3-D and 1-D (as 2-D with H=1).

Graph ops: conv_transpose2d, conv_transpose3d and conv_transpose1d,
(x, w[, bias]) with w of shape [C, OC / groups, kernel...] and attributes
strides, dilations, pads, output_padding (1-D in 2-D form; see pipeline.ops.geometry).
The converter resolves output_shape and auto_pad into explicit pads, which may
be negative. 2-D has a chunked, register-accumulating lowering; 3-D a plain one.
"""

from __future__ import annotations

import itertools
import math
from contextlib import contextmanager

from pipeline.dsl.vector import fma, zeros
from pipeline.kernels.registry import lowering
from pipeline.kernels.windows import lower_1d, plane_epilogue
from pipeline.ops.geometry import ceil_div

# Chunk sizes (in floats) of the transposed convolution: a chunk of input rows
# over a group's channels is packed block-major on the stack (so the products
# stream through it) and reused by every output channel of the group; the
# per-tap row buffers stay in L1. Products are summed over input channels in
# registers: _LANES x _UNROLL outputs for up to _TAP_GROUP taps at a time.
_X_CHUNK, _ROW_BUFFERS = 16384, 8192


_LANES, _UNROLL, _TAP_GROUP = 8, 2, 4


_BLOCK = _LANES * _UNROLL


def _conv_t_lower(kb, node, ins, out, epilogue):
    """Transposed convolution, one chunk of input rows and one group at a time:
    for each output channel and tap, the tap's weight times the chunk, summed
    over the group's input channels, goes to a stack row buffer, which is then
    scattered to the `stride` spaced outputs it belongs to. Tap ranges are
    computed here so that no bounds check remains."""
    x, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    _, c, h, wd = x.type.shape
    _, ocg, kh_n, kw_n = w.type.shape
    n_n, oc_n, oh_n, ow_n = out.type.shape
    (sh, sw), (dh, dw) = node.attr("strides"), node.attr("dilations")
    pt, pl = node.attr("pads")[:2]
    groups = node.attr("groups")
    icg = c // groups
    taps = []  # (kh, kw, ih range, iw range) of the taps that reach the output
    for kh in range(kh_n):
        # oh = ih * sh + kh * dh - pt must land in [0, oh_n)
        ih = (max(0, ceil_div(pt - kh * dh, sh)), min(h, (oh_n - 1 + pt - kh * dh) // sh + 1))
        for kw in range(kw_n):
            iw = (max(0, ceil_div(pl - kw * dw, sw)), min(wd, (ow_n - 1 + pl - kw * dw) // sw + 1))
            if ih[0] < ih[1] and iw[0] < iw[1]:
                taps.append((kh, kw, ih, iw))
    rows = max(1, min(h, _X_CHUNK // (wd * icg), _ROW_BUFFERS // (wd * max(1, len(taps)))))
    size = rows * wd  # one tap's row buffer
    row = kb.scratch(max(1, len(taps)) * size)
    packed = kb.scratch(icg * size)
    with kb.loop(0, n_n, "n") as n:
        with kb.loop(0, oc_n, "oc") as oc:
            init = kb.load(bias, oc) if bias else kb.f32(0.0)
            plane = (n * oc_n + oc) * (oh_n * ow_n)
            with kb.loop(0, oh_n * ow_n, "p") as p:
                kb.store(out, plane + p, init)
        with kb.loop(0, ceil_div(h, rows), "chunk") as chunk, \
                kb.loop(0, groups, "g") as group:
            r0 = chunk * rows
            n_rows = kb.smin(h - r0, rows)
            span = n_rows * wd
            n_blocks = span // _BLOCK
            x_base = (n * c + group * icg) * (h * wd) + r0 * wd
            # packed[(qb * icg + icl) * BLOCK + j] = x[icl, chunk q = qb * BLOCK + j]
            with kb.loop(0, n_blocks, "pb") as qb, kb.loop(0, icg, "pc") as icl, \
                    kb.loop(0, _BLOCK, "pj") as j:
                src = x_base + (icl * (h * wd) + (qb * _BLOCK + j))
                dst = (qb * icg + icl) * _BLOCK + j
                kb.store(packed, dst, kb.load(x, src))
            with kb.loop(0, ocg, "ocl") as ocl:
                oc = group * ocg + ocl
                plane = (n * oc_n + oc) * (oh_n * ow_n)
                w_base = (group * icg * ocg + ocl) * (kh_n * kw_n)
                for first in range(0, len(taps), _TAP_GROUP):
                    group_taps = list(enumerate(taps))[first:first + _TAP_GROUP]
                    _conv_t_products(kb, x, w, packed, row, group_taps, span, n_blocks, icg,
                                     x_base, w_base, ocg * kh_n * kw_n, kw_n, size)
                _conv_t_scatter(kb, node, out, row, taps, plane, r0, n_rows, wd, size)
        if epilogue is not None:
            with kb.loop(0, oc_n, "oc") as oc:
                plane_epilogue(kb, out, (n * oc_n + oc) * (oh_n * ow_n),
                                n, oc, epilogue)


def _conv_t_products(kb, x, w, packed, row, taps, span, n_blocks, icg, x_base, w_base,
                     w_ic_stride, kw_n, size):
    """row[t][q] = sum over the group's input channels ic of w[ic, tap t] *
    x[ic, chunk q], q < span, for the (t, tap) pairs in `taps`: whole blocks
    accumulate in vector registers reading the packed chunk, the tail in
    scalars reading x."""
    with kb.loop(0, n_blocks, "qb") as qb:
        accs = [[kb.local(zeros(_LANES)) for _ in range(_UNROLL)] for _ in taps]
        with kb.loop(0, icg, "icl") as icl:
            src = (qb * icg + icl) * _BLOCK
            xs = [kb.vload(packed, src + u * _LANES, _LANES) for u in range(_UNROLL)]
            w_ic = w_base + icl * w_ic_stride
            for slots, (_, (kh, kw, _, _)) in zip(accs, taps, strict=True):
                wv = kb.splat(kb.load(w, w_ic + (kh * kw_n + kw)), _LANES)
                for slot, xv in zip(slots, xs, strict=True):
                    kb.set(slot, fma(kb, wv, xv, kb.get(slot)))
        for slots, (t, _) in zip(accs, taps, strict=True):
            for u, slot in enumerate(slots):
                kb.vstore(row, qb * _BLOCK + (t * size + u * _LANES),
                       kb.get(slot))
    plane_size = x.type.shape[2] * x.type.shape[3]
    with kb.loop(n_blocks * _BLOCK, span, "qt") as q:
        for t, (kh, kw, _, _) in taps:
            acc = kb.local(kb.f32(0.0))
            with kb.loop(0, icg, "icl") as icl:
                src = x_base + (icl * plane_size + q)
                wv = kb.load(w, w_base + icl * w_ic_stride + (kh * kw_n + kw))
                kb.set(acc, kb.fadd(kb.get(acc), kb.fmul(wv, kb.load(x, src))))
            kb.store(row, q + t * size, kb.get(acc))


def _conv_t_scatter(kb, node, out, row, taps, plane, r0, n_rows, wd, size):
    """out[oh, ow] += row[t][ih - r0, iw] for every tap t and the chunk's input
    pixels (ih, iw) that tap sends into the output."""
    (sh, sw), (dh, dw) = node.attr("strides"), node.attr("dilations")
    pt, pl = node.attr("pads")[:2]
    ow_n = out.type.shape[3]
    for t, (kh, kw, (ih_lo, ih_hi), (iw_lo, iw_hi)) in enumerate(taps):
        lo, hi = kb.smax(r0, ih_lo), kb.smin(r0 + n_rows, ih_hi)
        with kb.loop(lo, hi, "ih") as ih:
            out_row = plane + (ih * sh + (kh * dh - pt)) * ow_n
            row_base = (ih - r0) * wd + t * size
            with kb.loop(iw_lo, iw_hi, "iw") as iw:
                o = out_row + (iw * sw + (kw * dw - pl))
                kb.store(out, o, kb.fadd(kb.load(out, o), kb.load(row, row_base + iw)))


def _conv_t_lower_nd(kb, node, ins, out, epilogue):
    """Transposed convolution over any number of spatial dims, plainly: per output
    channel and input channel, each tap scatters weight * x to the outputs it
    reaches, over input ranges computed here (no bounds checks). 3-D uses it."""
    x, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    c, *in_sp = x.type.shape[1:]
    _, ocg, *kernel = w.type.shape
    n_n, oc_n, *out_sp = out.type.shape
    strides, dilations = node.attr("strides"), node.attr("dilations")
    lows = node.attr("pads")[:len(in_sp)]
    icg, taps = c // node.attr("groups"), math.prod(kernel)
    plane, in_plane = math.prod(out_sp), math.prod(in_sp)
    in_strides, out_strides = x.strides[2:], out.strides[2:]
    with kb.loop(0, n_n, "n") as n, kb.loop(0, oc_n, "oc") as oc:
        base = (n * oc_n + oc) * plane
        init = kb.load(bias, oc) if bias else kb.f32(0.0)
        with kb.loop(0, plane, "p") as p:
            kb.store(out, base + p, init)
        group, ocl = oc // ocg, oc % ocg
        with kb.loop(0, icg, "icl") as icl:
            ic = group * icg + icl
            src = (n * c + ic) * in_plane
            w_base = (ic * ocg + ocl) * taps
            for t, tap in enumerate(itertools.product(*map(range, kernel))):
                # output o = i * stride + k * dilation - low must land in [0, out)
                dims = list(zip(tap, dilations, strides, lows, in_sp, out_sp, strict=True))
                ranges = [(max(0, ceil_div(lo - k * dl, s)), min(size, (o - 1 + lo - k * dl) // s
                                                                 + 1))
                          for k, dl, s, lo, size, o in dims]
                if any(a >= z for a, z in ranges):
                    continue
                wv = kb.load(w, w_base + t)
                shift = sum((k * dl - lo) * st for (k, dl, _, lo, _, _), st in
                            zip(dims, out_strides, strict=True))
                with _ranges(kb, ranges) as i:
                    steps = [s * st for s, st in zip(strides, out_strides, strict=True)]
                    o = base + (kb.dot(i, steps) + shift)
                    v = kb.load(x, src + kb.dot(i, in_strides))
                    kb.store(out, o, kb.fadd(kb.load(out, o), kb.fmul(wv, v)))
        if epilogue is not None:
            with kb.nest(tuple(out_sp), "e") as pixel:
                o = base + kb.dot(pixel, out_strides)
                kb.store(out, o, epilogue(kb.load(out, o), [n, oc, *pixel]))


@contextmanager
def _ranges(kb, ranges):
    """Nested loops over the index ranges [(start, stop), ...]; yields the indices."""
    if not ranges:
        yield []
        return
    (start, stop), rest = ranges[0], ranges[1:]
    with kb.loop(start, stop, f"r{len(ranges)}") as i, _ranges(kb, rest) as others:
        yield [i, *others]


lowering("conv_transpose3d", lower=_conv_t_lower_nd)

lowering("conv_transpose2d", lower=_conv_t_lower)


_conv_t1d_lower = lower_1d(_conv_t_lower)


lowering("conv_transpose1d", lower=_conv_t1d_lower)
