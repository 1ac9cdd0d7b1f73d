"""Pooling: MaxPool, AveragePool, LpPool (2-D and 3-D, and 1-D as 2-D with H=1)
and GlobalAveragePool, GlobalMaxPool, GlobalLpPool (any number of spatial dims).

Graph ops: max_pool2d/avg_pool2d/lp_pool2d, their 3-D and 1-D forms (attrs
kernel, strides, dilations, pads (all begins, then all ends; 1-D in 2-D form),
ceil_mode, count_include_pad; p for Lp), global_avg_pool, global_max_pool and
global_lp_pool (p).
"""

from __future__ import annotations

import itertools
import math

from pipeline.dsl.builder import FLOATS
from pipeline.dsl.vector import ELEMENT_WORK, parallel_nest
from pipeline.kernels.registry import lowering
from pipeline.kernels.windows import lower_1d

# The smallest value of the 8-bit integer types a max pool takes (quantized tensors).
INT8 = {"uint8": 0, "int8": -128}


def int8_max(kb, dtype: str, a, b):
    """max(a, b) of uint8 / int8 scalars or vectors."""
    cmp = kb.b.icmp_unsigned if dtype == "uint8" else kb.b.icmp_signed
    return kb.b.select(cmp(">", a, b), a, b)


def _lp_term(kb, node, v):
    """|v| ** p, the summand of an Lp pool."""
    p = node.attr("p")
    return kb.fmul(v, v) if p == 2 else kb.intrinsic("pow", kb.intrinsic("fabs", v),
                                                     kb.f32(p))


def _lp_root(kb, node, acc):
    p = node.attr("p")
    return kb.intrinsic("sqrt", acc) if p == 2 else kb.intrinsic("pow", acc, kb.f32(1.0 / p))


def _pool_lower(kb, node, ins, out, epilogue):
    """Max, average or Lp norm over each window (any number of spatial dims); taps
    outside the input are skipped with a select on a clamped (always in-bounds)
    load."""
    work = out.type.size * (math.prod(node.attr("kernel")) + ELEMENT_WORK)
    with parallel_nest(kb, out.type.shape, "o", work=work) as index:
        _pool_window(kb, node, ins, out, epilogue, index)


def _pool_dims(kb, node, ins, out, epilogue, shapes=None):
    """_pool_lower with runtime dimensions (a symbolic height or width: the shapes
    hold Index values, pipeline/dsl/dims.py): the same window code in a plain nest,
    on one thread (an outlined parallel body would need the shapes reloaded)."""
    with kb.nest(out.type.shape, "o") as index:
        _pool_window(kb, node, ins, out, epilogue, index)


def _pool_window(kb, node, ins, out, epilogue, index):
    """The value of output element `index`, stored."""
    x = ins[0]
    is_max = node.op.startswith("max_pool")
    is_lp = node.op.startswith("lp_pool")
    spatial = x.type.shape[2:]
    kernel, strides, dilations = node.attr("kernel"), node.attr("strides"), \
        node.attr("dilations")
    pads, d = node.attr("pads"), len(spatial)
    include_pad = bool(node.attr("count_include_pad", 0))
    n, c, *o = index
    base = (n * x.type.shape[1] + c) * math.prod(spatial)
    # Per dim and kernel position: (clamped input offset, inside, inside the pads).
    taps = []
    for i in range(d):
        size, stride = spatial[i], x.strides[2 + i]
        lo, hi = pads[i], pads[d + i]
        row = []
        for k in range(kernel[i]):
            at = o[i] * strides[i] + (k * dilations[i] - lo)
            inside, padded = kb.inside(at, 0, size), kb.inside(at, -lo, size + hi)
            row.append((kb.clamp(at, size) * stride, inside, padded))
        taps.append(row)
    acc = kb.f32(-math.inf if is_max else 0.0)
    if x.type.dtype in INT8:  # max of a quantized tensor (FuseQDQ): on its bytes
        acc = kb.const(INT8[x.type.dtype], x.elem)
    elif is_max and x.elem not in FLOATS:  # other integers: from the type's minimum
        acc = kb.const(-(2 ** (x.elem.width - 1)), x.elem)
    count = kb.f32(0.0)
    for tap in itertools.product(*taps):
        ok, padded, at = tap[0][1], tap[0][2], base + tap[0][0]
        for offset, inside, in_pads in tap[1:]:
            at = at + offset
            ok, padded = kb.and_(ok, inside), kb.and_(padded, in_pads)
        v = kb.load(x, at)
        if is_max:
            acc = kb.select(ok, int8_max(kb, x.type.dtype, acc, v)
                            if x.type.dtype in INT8 else kb.arith("max", acc, v), acc)
            continue
        acc = kb.select(ok, kb.fadd(acc, _lp_term(kb, node, v) if is_lp else v), acc)
        # With count_include_pad the padding counts, the ceil_mode overhang
        # beyond it does not.
        count = kb.select(padded if include_pad else ok, kb.fadd(count, kb.f32(1.0)), count)
    if is_lp:
        acc = _lp_root(kb, node, acc)
    elif not is_max:
        acc = kb.fdiv(acc, kb.fmax(count, kb.f32(1.0)))
    if epilogue is not None:
        acc = epilogue(acc, index)
    kb.store(out, kb.dot(index, out.strides), acc)


_pool1d_lower = lower_1d(_pool_lower)


for _kind in ("max", "avg", "lp"):
    lowering(f"{_kind}_pool2d", lower=_pool_lower, lower_dims=_pool_dims)
    lowering(f"{_kind}_pool3d", lower=_pool_lower, lower_dims=_pool_dims)
    lowering(f"{_kind}_pool1d", lower=_pool1d_lower)


def _global_pool_lower(kb, node, ins, out, epilogue):
    """Max, average or Lp norm over each (n, c) plane; with runtime dimensions too
    (a symbolic height or width: the plane's size is an Index, the mean's divisor a
    runtime float)."""
    x = ins[0]
    n_n, c_n, *spatial = x.type.shape
    size = math.prod(spatial)
    kind = node.op[len("global_"):-len("_pool")]
    with kb.loop(0, n_n, "n") as n, kb.loop(0, c_n, "c") as c:
        base = (n * c_n + c) * size
        acc = kb.local(kb.f32(-math.inf if kind == "max" else 0.0))
        with kb.loop(0, size, "p") as p:
            v = kb.load(x, base + p)
            if kind == "max":
                kb.set(acc, kb.fmax(kb.get(acc), v))
            else:
                kb.set(acc, kb.fadd(kb.get(acc), _lp_term(kb, node, v) if kind == "lp" else v))
        value = {"max": lambda a: a,
                 "avg": lambda a: (kb.fmul(a, kb.f32(1.0 / size)) if isinstance(size, int)
                                   else kb.fdiv(a, kb.cast(size, "float32"))),
                 "lp": lambda a: _lp_root(kb, node, a)}[kind](kb.get(acc))
        if epilogue is not None:
            value = epilogue(value, [n, c] + [0] * len(spatial))
        kb.store(out, n * c_n + c, value)


for _kind in ("avg", "max", "lp"):
    lowering(f"global_{_kind}_pool", lower=_global_pool_lower,
             lower_dims=lambda kb, node, ins, out, epilogue, shapes=None:
             _global_pool_lower(kb, node, ins, out, epilogue))
