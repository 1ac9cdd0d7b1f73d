"""Resize and Upsample: nearest (all rounding modes), n-linear and cubic
interpolation with the ONNX coordinate transformation modes, from scales or sizes.

Per output axis the source coordinate of every output index is computed here,
in float32 as onnxruntime does, and turned into taps: (input offset, weight)
tables, one tap per axis for nearest (an index remap), two for linear, four for
cubic. An output element is the weighted sum over every combination of one tap
per axis; axes that need no blending (batch, channels) have a single tap.
"""

from __future__ import annotations

import itertools
import math

import llvmlite.ir as ir

from pipeline.dsl.builder import F32
from pipeline.dsl.index import Index
from pipeline.dsl.vector import ELEMENT_WORK, parallel_for, parallel_nest
from pipeline.kernels.movement import axis_term
from pipeline.kernels.registry import lowering
from pipeline.ops.resize_taps import extrapolated, taps_of


def _resize_lower(kb, node, ins, out, epilogue):
    """Sum over every combination of one tap per axis of weight product x input; the
    extrapolation value where an axis maps outside the input (tf_crop_and_resize)."""
    taps = taps_of(node, ins[0].type, out.type)
    masks = extrapolated(node, ins[0].type, out.type)
    work = out.type.size * ELEMENT_WORK * 2
    with parallel_nest(kb, out.type.shape, "o", work=work) as index:
        axes = [[(axis_term(kb, offsets, i),
                  None if w is None else kb.load_table(kb.table(w.tolist(), F32), i))
                 for offsets, w in axis] for i, axis in zip(index, taps, strict=True)]
        value = None
        for combo in itertools.product(*axes):
            offset, weight = 0, None
            for term, w in combo:
                offset = offset + term
                if w is not None:
                    weight = w if weight is None else kb.fmul(weight, w)
            term = kb.load(ins[0], offset)
            term = term if weight is None else kb.fmul(weight, term)
            value = term if value is None else kb.fadd(value, term)
        value = _extrapolate(kb, node, masks, index, value)
        if epilogue is not None:
            value = epilogue(value, index)
        kb.store(out, kb.dot(index, out.strides), value)


def _extrapolate(kb, node, masks, index, value):
    """`value`, or the extrapolation value where an axis's mask (a table of 1.0 for an
    index inside the input, 0.0 outside) says outside."""
    inside = None
    for i, mask in zip(index, masks, strict=True):
        if mask is not None:
            flag = kb.load_table(kb.table((~mask).astype(float).tolist(), F32), i)
            inside = flag if inside is None else kb.fmul(inside, flag)
    if inside is None:
        return value
    fill = kb.const(node.attr("extrapolation", 0.0), value.type)
    return kb.select(kb.compare(">", inside, kb.f32(0.5)), value, fill)


lowering("resize", lower=_resize_lower)


_CUBIC_A = -0.75  # Keys' kernel, as GridSample and onnxruntime use


def _grid_sample_lower(kb, node, ins, out, epilogue):
    """Per output point (split over threads): each spatial dim's coordinate, its taps
    (index, weight) under the padding rule; then every channel sums the tap products."""
    x, grid = ins
    spatial = x.type.shape[2:]
    r, points = len(spatial), math.prod(grid.type.shape[1:-1])
    channels = x.type.shape[1]
    combos = {"nearest": 1, "linear": 2, "cubic": 4}[node.attr("mode")] ** r
    with parallel_for(kb, x.type.shape[0] * points, "p",
                      work=x.type.size // max(1, math.prod(spatial)) * points * combos) as item:
        n, o = item // points, item % points
        taps = [_grid_taps(kb, node, kb.load(grid, item * r + (r - 1 - i)), dim)
                for i, dim in enumerate(spatial)]
        products = []
        for combo in itertools.product(*taps):
            weight, offset = kb.f32(1.0), 0
            for (index, w), stride in zip(combo, x.strides[2:], strict=True):
                weight, offset = kb.fmul(weight, w), offset + index * stride
            products.append((offset, weight))
        with kb.loop(0, channels, "c") as c:
            base = n * x.strides[0] + c * x.strides[1]
            acc = kb.f32(0.0)
            for offset, weight in products:
                acc = kb.fadd(acc, kb.fmul(weight, kb.load(x, base + offset)))
            kb.store(out, n * out.strides[0] + c * out.strides[1] + o, acc)


def _grid_taps(kb, node, g, dim: int) -> list:
    """[(Index, weight)] of one spatial dim of `dim` pixels at normalised coordinate g."""
    align = bool(node.attr("align_corners"))
    lo, hi = (0.0, dim - 1.0) if align else (-0.5, dim - 0.5)
    f = kb.f32
    pos = kb.fmul(kb.fadd(g, f(1.0)), f((dim - 1) / 2.0)) if align else \
        kb.fmul(kb.fsub(kb.fmul(kb.fadd(g, f(1.0)), f(float(dim))), f(1.0)), f(0.5))
    mode, padding = node.attr("mode"), node.attr("padding")
    if mode == "nearest":
        pos = kb.intrinsic("rint", pos)
    outside = kb.or_(kb.compare("<", pos, f(lo)), kb.compare(">", pos, f(hi)))
    if padding == "border":
        pos = kb.select(outside, kb.fmin(kb.fmax(pos, f(0.0)), f(dim - 1.0)), pos)
    elif padding == "reflection":
        pos = kb.select(outside, _reflect(kb, pos, lo, hi), pos)
    if mode == "nearest":
        return [_grid_pixel(kb, kb.cast(pos, "int64"), f(1.0), dim, padding, lo, hi)]
    first = kb.intrinsic("floor", pos)
    t = kb.fsub(pos, first)
    start = kb.cast(first, "int64")
    weights = [kb.fsub(f(1.0), t), t] if mode == "linear" else _cubic_weights(kb, t)
    shift = 0 if mode == "linear" else -1
    return [_grid_pixel(kb, kb.b.add(start, ir.Constant(start.type, k + shift)), w, dim,
                        padding, lo, hi) for k, w in enumerate(weights)]


def _grid_pixel(kb, index, weight, dim: int, padding: str, lo: float, hi: float):
    """(Index, weight) of pixel `index` (i64) under the padding rule: zeros weighs a
    pixel outside by 0, border clamps it, reflection reflects it into [lo, hi]."""
    if padding == "reflection":
        index = kb.cast(_reflect(kb, kb.cast(index, "float32"), lo, hi), "int64")
    inside = kb.and_(kb.compare(">=", index, ir.Constant(index.type, 0)),
                     kb.compare("<", index, ir.Constant(index.type, dim)))
    if padding == "zeros":
        weight = kb.select(inside, weight, kb.f32(0.0))
    clamped = kb.arith("min", kb.arith("max", index, ir.Constant(index.type, 0)),
                       ir.Constant(index.type, dim - 1))
    return Index(kb, clamped), weight


def _reflect(kb, v, lo: float, hi: float):
    """v reflected off lo and hi until inside [lo, hi]."""
    f = kb.f32
    span = hi - lo
    if span <= 0:
        return f(lo)

    def fold(distance, near: float, far: float):
        turns = kb.intrinsic("floor", kb.fmul(distance, f(1.0 / span)))
        rest = kb.fsub(distance, kb.fmul(turns, f(span)))
        even = kb.compare("==", kb.b.frem(turns, f(2.0)), f(0.0))
        toward = (lambda a, b: kb.fadd(a, b)) if near < far else (lambda a, b: kb.fsub(a, b))
        away = (lambda a, b: kb.fsub(a, b)) if near < far else (lambda a, b: kb.fadd(a, b))
        return kb.select(even, toward(f(near), rest), away(f(far), rest))

    below = fold(kb.fsub(f(lo), v), lo, hi)
    above = fold(kb.fsub(v, f(hi)), hi, lo)
    return kb.select(kb.compare("<", v, f(lo)), below,
                     kb.select(kb.compare(">", v, f(hi)), above, v))


def _cubic_weights(kb, t) -> list:
    """Keys' cubic weights of the taps at -1, 0, 1, 2 for the fraction t in [0, 1)."""
    f, a = kb.f32, _CUBIC_A

    def far(s):  # |s| in [1, 2)
        return kb.fsub(kb.fmul(kb.fadd(kb.fmul(kb.fsub(kb.fmul(f(a), s), f(5 * a)), s),
                                       f(8 * a)), s), f(4 * a))

    def near(s):  # |s| in [0, 1)
        return kb.fadd(kb.fmul(kb.fmul(kb.fsub(kb.fmul(f(a + 2), s), f(a + 3)), s), s),
                       f(1.0))

    one_minus = kb.fsub(f(1.0), t)
    return [far(kb.fadd(t, f(1.0))), near(t), near(one_minus), far(kb.fadd(one_minus, f(1.0)))]


lowering("grid_sample", lower=_grid_sample_lower)
