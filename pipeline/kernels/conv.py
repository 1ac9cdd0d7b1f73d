"""Convolution: Conv, 2-D (NCHW), 3-D and 1-D (as 2-D with H=1); ConvTranspose
is in conv_transpose.py.

Graph ops: conv2d, conv3d and conv1d, all (x, w[, bias]); conv1d has 2-D
attributes (see pipeline.ops.geometry) and runs the 2-D lowering on a (N, C, 1, W)
view of the same memory. conv3d always runs the implicit GEMM. causal_conv and
causal_conv_state are CausalConvWithState's outputs (pipeline/ops/conv.py).

Shapes are static, so loop bounds that depend only on kernel taps are computed
here in Python: padding never reaches the inner loops, which stay branch-free
and vectorisable.
"""

from __future__ import annotations

import itertools
import math

from pipeline.dsl.gemm_tile import PANEL_COLUMNS, tiled_gemm
from pipeline.dsl.vector import ELEMENT_WORK, parallel_for
from pipeline.kernels.registry import lowering
from pipeline.kernels.runtime_dims import conv_dims
from pipeline.kernels.windows import lower_1d, plane_epilogue
from pipeline.ops.geometry import causal_parts, ceil_div

# Convolutions with at least this many output channels per group and this
# long a reduction (C/groups * kh * kw) run as a GEMM; others (depthwise) direct.
_GEMM_MIN_OCG, _GEMM_MIN_K = 4, 8


def _conv_lower(kb, node, ins, out, epilogue):
    """conv2d: an implicit GEMM per (image, group) when it has enough output
    channels and a long enough reduction, else the direct loops below."""
    oc_n, icg, kh_n, kw_n = ins[1].type.shape
    if oc_n // node.attr("groups") >= _GEMM_MIN_OCG and icg * kh_n * kw_n >= _GEMM_MIN_K:
        _conv_gemm(kb, node, ins, out, epilogue)
    else:
        _conv_direct(kb, node, ins, out, epilogue)


def _conv_gemm(kb, node, ins, out, epilogue):
    """out[n, g] (OC/g x P) = w[g] (OC/g x K) @ patches (K x P), K = C/g * taps and P
    the output pixels, by gemm_tile, for any number of spatial dims. The patch
    matrix is never built: `pack` fills gemm_tile's panel for whole input
    channels, column (output pixel) by column, each tap a bounds-checked load
    (zero in the padding); `load_b` maps a single (k, p) for the columns that
    fill no panel. A 1x1, stride 1, unpadded convolution reads the input
    directly."""
    x, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    c, *in_sp = x.type.shape[1:]
    oc_n, icg, *kernel = w.type.shape
    n_n, _, *out_sp = out.type.shape
    strides, dilations = node.attr("strides"), node.attr("dilations")
    lows = node.attr("pads")[:len(in_sp)]
    groups = node.attr("groups")
    ocg, taps, plane, in_plane = oc_n // groups, math.prod(kernel), math.prod(out_sp), \
        math.prod(in_sp)
    k_n = icg * taps
    in_strides = [math.prod(in_sp[i + 1:]) for i in range(len(in_sp))]
    direct = taps == 1 and set(strides) == {1} and set(lows) == {0} and out_sp == in_sp

    def patch(src, starts, tap):
        """x at input pixel starts + tap * dilations from `src`, 0 outside."""
        ok, at = None, 0
        for pos0, k, dl, size, stride in zip(starts, tap, dilations, in_sp, in_strides,
                                              strict=True):
            pos = pos0 + k * dl
            inside = kb.below(pos, size)  # pos is an int when the output is 1 wide
            ok = inside if ok is None else kb.and_(ok, inside)
            at = at + pos * stride
        # Clamp the offset so the load stays in bounds; the select drops it.
        v = kb.load(x, src + kb.select(ok, at, 0))
        return kb.select(ok, v, kb.f32(0.0))

    def starts_of(p):
        return [o * s - lo for o, s, lo in
                zip(kb.unflatten(p, out_sp), strides, lows, strict=True)]

    with kb.loop(0, n_n, "n") as n, kb.loop(0, groups, "g") as g:
        x_base = (n * c + g * icg) * in_plane
        w_base = g * ocg * k_n

        def load_a(m, k):
            return kb.load(w, w_base + (m * k_n + k))

        def load_b(k, p):
            if direct:
                return kb.load(x, x_base + (k * in_plane + p))
            ic, tap = k // taps, k % taps
            return patch(x_base + ic * in_plane, starts_of(p),
                         kb.unflatten(tap, kernel))

        def pack(panel, k0, k_len, n0):
            # Channel outer, column inner: the inner loop reads neighbouring
            # pixels and writes a panel row, so it vectorises without gathers.
            with kb.loop(0, k_len // taps, "pc") as icl, kb.loop(0, PANEL_COLUMNS, "pj") as j:
                starts = starts_of(n0 + j)
                src = x_base + (icl + k0 // taps) * in_plane
                for t, tap in enumerate(itertools.product(*map(range, kernel))):
                    k = icl * taps + t
                    kb.store(panel, k * PANEL_COLUMNS + j,
                             patch(src, starts, tap))

        c_base = (n * oc_n + g * ocg) * plane
        tiled_gemm(kb, (ocg, plane, k_n), load_a, load_b, out, c_base, by_column=not direct,
                   pack_b=None if direct else pack, k_chunk=max(1, 512 // taps) * taps)
    if bias is None and epilogue is None:
        return
    with kb.loop(0, n_n, "n") as n, kb.loop(0, oc_n, "oc") as oc:
        base = (n * oc_n + oc) * plane
        shift = kb.load(bias, oc) if bias else None
        with kb.nest(tuple(out_sp), "e") as pixel:
            o = base + kb.dot(pixel, out.strides[2:])
            v = kb.load(out, o)
            if shift is not None:
                v = kb.fadd(v, shift)
            if epilogue is not None:
                v = epilogue(v, [n, oc, *pixel])
            kb.store(out, o, v)


def _conv_direct(kb, node, ins, out, epilogue):
    """Direct convolution, one output-channel plane at a time.

    The plane is initialised with the bias; per input channel, the interior
    (outputs every tap reaches inside the input) takes all taps in one pass,
    the border rectangles tap by tap over ranges computed here, so no inner
    loop has a bounds check. The epilogue runs while the plane is in cache.
    """
    x, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    _, c, h, wd = x.type.shape
    oc_n, icg, kh_n, kw_n = w.type.shape
    n_n, _, oh_n, ow_n = out.type.shape
    (sh, sw), (dh, dw) = node.attr("strides"), node.attr("dilations")
    pt, pl = node.attr("pads")[:2]
    ocg = oc_n // node.attr("groups")
    # Output rows (cols) each kernel row (col) reaches inside the input.
    rows = [(max(0, ceil_div(pt - kh * dh, sh)), min(oh_n, (h - 1 + pt - kh * dh) // sh + 1))
            for kh in range(kh_n)]
    cols = [(max(0, ceil_div(pl - kw * dw, sw)), min(ow_n, (wd - 1 + pl - kw * dw) // sw + 1))
            for kw in range(kw_n)]
    inner = ((max(r[0] for r in rows), min(r[1] for r in rows)),
             (max(q[0] for q in cols), min(q[1] for q in cols)))
    (i0, i1), (j0, j1) = inner
    if i0 >= i1 or j0 >= j1:
        borders = [((0, oh_n), (0, ow_n))]
        inner = None
    else:
        borders = [((0, i0), (0, ow_n)), ((i1, oh_n), (0, ow_n)), ((i0, i1), (0, j0)),
                   ((i0, i1), (j1, ow_n))]
    work = out.type.size * icg * kh_n * kw_n
    with parallel_for(kb, n_n * oc_n, "planes", work=work) as item:
        n, oc = item // oc_n, item % oc_n
        plane = (n * oc_n + oc) * (oh_n * ow_n)
        init = kb.load(bias, oc) if bias else kb.f32(0.0)
        with kb.loop(0, oh_n * ow_n, "p") as p:
            kb.store(out, plane + p, init)
        group = oc // ocg
        with kb.loop(0, icg, "icl") as icl:
            ic = group * icg + icl
            in_plane = (n * c + ic) * (h * wd)
            w_base = (oc * icg + icl) * (kh_n * kw_n)
            taps = [(kh, kw, kb.load(w, w_base + (kh * kw_n + kw)))
                    for kh in range(kh_n) for kw in range(kw_n)]
            if inner is not None:
                _conv_taps(kb, node, x, out, in_plane, plane, taps, inner)
            for (r0, r1), (q0, q1) in borders:
                for kh, kw, wv in taps:
                    box = ((max(r0, rows[kh][0]), min(r1, rows[kh][1])),
                           (max(q0, cols[kw][0]), min(q1, cols[kw][1])))
                    if box[0][0] < box[0][1] and box[1][0] < box[1][1]:
                        _conv_taps(kb, node, x, out, in_plane, plane, [(kh, kw, wv)], box)
        plane_epilogue(kb, out, plane, n, oc, epilogue)


def _conv_taps(kb, node, x, out, in_plane, plane, taps, box):
    """out[oh, ow] += sum over `taps` (kh, kw, weight) of weight * x[ih, iw] for
    the outputs in `box` ((oh range), (ow range)), where every tap is in bounds."""
    _, _, _, wd = x.type.shape
    ow_n = out.type.shape[3]
    (sh, sw), (dh, dw) = node.attr("strides"), node.attr("dilations")
    pt, pl = node.attr("pads")[:2]
    (r0, r1), (q0, q1) = box
    with kb.loop(r0, r1, "oh") as oh:
        out_row = plane + oh * ow_n
        in_row = in_plane + (oh * sh - pt) * wd
        with kb.loop(q0, q1, "ow") as ow:
            o = out_row + ow
            at = in_row + (ow * sw - pl)
            acc = kb.load(out, o)
            for kh, kw, wv in taps:
                v = kb.load(x, at + (kh * dh * wd + kw * dw))
                acc = kb.fadd(acc, kb.fmul(wv, v))
            kb.store(out, o, acc)


lowering("conv2d", lower=_conv_lower, lower_dims=conv_dims)

lowering("conv3d", lower=_conv_gemm, lower_dims=conv_dims)


_conv1d_lower = lower_1d(_conv_lower)


lowering("conv1d", lower=_conv1d_lower)


def _causal_conv_lower(kb, node, ins, out, epilogue):
    """Per (b, c) row: the first k - 1 outputs, whose taps reach into the past state,
    unrolled with their taps resolved here; the rest a loop over x alone."""
    x, w, bias, past = causal_parts(ins, node)
    _, channels, length = x.type.shape
    k = w.type.shape[2]
    zero = kb.const(0.0, out.elem)
    with parallel_for(kb, x.type.shape[0] * channels, "row",
                      work=out.type.size * k * ELEMENT_WORK) as row:
        c = row % channels
        taps = [kb.load(w, c * k + j) for j in range(k)]
        start = kb.load(bias, c) if bias is not None else zero

        def padded(p):  # position p of the past state (zeros) followed by x
            if p >= k - 1 or not isinstance(p, int):
                return kb.load(x, row * length + p - (k - 1))
            return kb.load(past, row * (k - 1) + p) if past is not None else zero

        def emit(t):
            acc = start
            for j, tap in enumerate(taps):
                acc = kb.fadd(acc, kb.fmul(tap, padded(t + j)))
            if epilogue is not None:
                acc = epilogue(acc, [row // channels, c, t])
            kb.store(out, row * length + t, acc)

        for t in range(min(k - 1, length)):
            emit(t)
        if length > k - 1:
            with kb.loop(k - 1, length, "t") as t:
                emit(t)


def _causal_state_lower(kb, node, ins, out, epilogue):
    """Per (b, c) row: the last `state` positions of the past state (zeros) then x."""
    x, _, _, past = causal_parts(ins, node)
    _, channels, length = x.type.shape
    state = node.attr("state")
    if not state:
        return
    with parallel_for(kb, x.type.shape[0] * channels, "row",
                      work=out.type.size * ELEMENT_WORK) as row:
        if length < state:  # the state keeps past positions length.. (zeros without one)
            with kb.loop(0, state - length, "j") as j:
                kb.store(out, row * state + j, kb.const(0.0, out.elem) if past is None else
                         kb.load(past, row * state + j + length))
        with kb.loop(max(0, state - length), state, "j") as j:
            kb.store(out, row * state + j, kb.load(x, row * length + j + length - state))


lowering("causal_conv", lower=_causal_conv_lower)

lowering("causal_conv_state", lower=_causal_state_lower)
