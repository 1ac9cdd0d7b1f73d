"""Pooling: MaxPool, AveragePool, LpPool (2-D, and 1-D as H=1) and
GlobalAveragePool, GlobalMaxPool, GlobalLpPool (any number of spatial dims).

Graph ops: max_pool2d/avg_pool2d/lp_pool2d and their 1-D forms (attrs kernel,
strides, dilations, pads in 2-D form, ceil_mode, count_include_pad; p for Lp),
global_avg_pool, global_max_pool and global_lp_pool (p).
"""

from __future__ import annotations

import math

from pipeline.errors import ModelError
from pipeline.ir.graph import Node, TensorType
from pipeline.ops.nn import as_1d, lift_1d, spatial_attrs, window_out
from pipeline.ops.registry import onnx_op, register


def _pool_infer(types, node):
    n, c, h, w = types[0].shape
    (kh, kw), (sh, sw), (dh, dw) = node.attr("kernel"), node.attr("strides"), \
        node.attr("dilations")
    pt, pl, pb, pr = node.attr("pads")
    ceil = bool(node.attr("ceil_mode", 0))
    oh, ow = window_out(h, kh, sh, pt, pb, dh, ceil), window_out(w, kw, sw, pl, pr, dw, ceil)
    if oh < 1 or ow < 1:
        raise ModelError(f"node {node.name!r} ({node.op}): window {[kh, kw]} does not fit "
                         f"the padded input {list(types[0].shape)}")
    return [TensorType((n, c, oh, ow), types[0].dtype)]


def _lp_term(kb, node, v):
    """|v| ** p, the summand of an Lp pool."""
    p = node.attr("p")
    return kb.fmul(v, v) if p == 2 else kb.intrinsic("pow", kb.intrinsic("fabs", v),
                                                     kb.f32(p))


def _lp_root(kb, node, acc):
    p = node.attr("p")
    return kb.intrinsic("sqrt", acc) if p == 2 else kb.intrinsic("pow", acc, kb.f32(1.0 / p))


def _pool_lower(kb, node, ins, out, epilogue):
    """Max, average or Lp norm over each window; taps outside the input are
    skipped with a select on a clamped (always in-bounds) load."""
    x = ins[0]
    is_max = node.op.startswith("max_pool")
    is_lp = node.op.startswith("lp_pool")
    _, _, h, w = x.type.shape
    (kh_n, kw_n), (sh, sw), (dh, dw) = node.attr("kernel"), node.attr("strides"), \
        node.attr("dilations")
    pt, pl, pb, pr = node.attr("pads")
    include_pad = bool(node.attr("count_include_pad", 0))
    b = kb.b
    with kb.nest(out.type.shape, "o") as (n, c, oh, ow):
        in_plane = kb.mul(kb.add(kb.mul(n, x.type.shape[1]), c), h * w)
        acc = kb.f32(-math.inf if is_max else 0.0)
        count = kb.f32(0.0)
        for kh in range(kh_n):
            ih = kb.add(kb.mul(oh, sh), kh * dh - pt)
            ok_h = b.and_(b.icmp_signed(">=", ih, kb.i64(0)), b.icmp_signed("<", ih, kb.i64(h)))
            pad_h = b.and_(b.icmp_signed(">=", ih, kb.i64(-pt)),
                           b.icmp_signed("<", ih, kb.i64(h + pb)))
            ih_c = _clamp(kb, ih, h)
            for kw in range(kw_n):
                iw = kb.add(kb.mul(ow, sw), kw * dw - pl)
                ok = b.and_(ok_h, b.and_(b.icmp_signed(">=", iw, kb.i64(0)),
                                         b.icmp_signed("<", iw, kb.i64(w))))
                v = kb.load(x, kb.add(in_plane, kb.add(kb.mul(ih_c, w), _clamp(kb, iw, w))))
                if is_max:
                    acc = b.select(ok, kb.fmax(acc, v), acc)
                    continue
                acc = b.select(ok, kb.fadd(acc, _lp_term(kb, node, v) if is_lp else v), acc)
                if is_lp:
                    continue
                counted = ok
                if include_pad:
                    # Padding counts, the ceil_mode overhang beyond it does not.
                    counted = b.and_(pad_h, b.and_(b.icmp_signed(">=", iw, kb.i64(-pl)),
                                                   b.icmp_signed("<", iw, kb.i64(w + pr))))
                count = b.select(counted, kb.fadd(count, kb.f32(1.0)), count)
        if is_lp:
            acc = _lp_root(kb, node, acc)
        elif not is_max:
            acc = kb.fdiv(acc, kb.fmax(count, kb.f32(1.0)))
        if epilogue is not None:
            acc = epilogue(acc, [n, c, oh, ow])
        kb.store(out, kb.dot([n, c, oh, ow], out.strides), acc)


def _clamp(kb, v, size):
    b = kb.b
    low = b.select(b.icmp_signed("<", v, kb.i64(0)), kb.i64(0), v)
    return b.select(b.icmp_signed(">=", low, kb.i64(size)), kb.i64(size - 1), low)


_pool1d_infer, _pool1d_lower = as_1d(_pool_infer, _pool_lower)
for _kind in ("max", "avg", "lp"):
    register(f"{_kind}_pool2d", "anchor", _pool_infer, lower=_pool_lower)
    register(f"{_kind}_pool1d", "anchor", _pool1d_infer, lower=_pool1d_lower)


def _pool_converter(kind: str):
    def convert(ctx, n):
        if len([o for o in n.outputs if o]) > 1:
            raise ModelError(f"node {n.name!r} ({n.op_type}): the Indices output "
                             "is not supported")
        if "kernel_shape" not in n.attrs:
            raise ModelError(f"node {n.name!r} ({n.op_type}): kernel_shape is required")
        kernel = tuple(int(k) for k in n.attrs["kernel_shape"])
        attrs = spatial_attrs(n, ctx.type(n.inputs[0]).shape, kernel)
        attrs["kernel"] = kernel
        op = f"{kind}_pool2d"
        if len(kernel) == 1:
            op, attrs = f"{kind}_pool1d", lift_1d(attrs)
        if kind == "lp":
            attrs["p"] = _lp_p(n)
        return [Node.make(op, n.name, n.inputs[:1], n.outputs[:1],
                          ceil_mode=int(n.attrs.get("ceil_mode", 0)),
                          count_include_pad=int(n.attrs.get("count_include_pad", 0)),
                          **attrs)]
    return convert


def _lp_p(n) -> float:
    """LpPool's p: a float attribute before opset 2, an int after; positive."""
    p = float(n.attrs.get("p", 2))
    if p <= 0:
        raise ModelError(f"node {n.name!r} ({n.op_type}): p must be positive, got {p}")
    return p


onnx_op("MaxPool", 1)(_pool_converter("max"))
onnx_op("AveragePool", 1)(_pool_converter("avg"))
onnx_op("LpPool", 1)(_pool_converter("lp"))


# -- global pooling: one value per (n, c) plane ----------------------------------------

def _global_infer(types, node):
    shape = types[0].shape
    return [TensorType(shape[:2] + (1,) * (len(shape) - 2), types[0].dtype)]


def _global_pool_lower(kb, node, ins, out, epilogue):
    x = ins[0]
    n_n, c_n, *spatial = x.type.shape
    size = math.prod(spatial)
    kind = node.op[len("global_"):-len("_pool")]
    with kb.loop(0, n_n, "n") as n, kb.loop(0, c_n, "c") as c:
        base = kb.mul(kb.add(kb.mul(n, c_n), c), size)
        acc = kb.local(kb.f32(-math.inf if kind == "max" else 0.0))
        with kb.loop(0, size, "p") as p:
            v = kb.load(x, kb.add(base, p))
            if kind == "max":
                kb.set(acc, kb.fmax(kb.get(acc), v))
            else:
                kb.set(acc, kb.fadd(kb.get(acc), _lp_term(kb, node, v) if kind == "lp" else v))
        value = {"max": lambda a: a, "avg": lambda a: kb.fmul(a, kb.f32(1.0 / size)),
                 "lp": lambda a: _lp_root(kb, node, a)}[kind](kb.get(acc))
        if epilogue is not None:
            value = epilogue(value, [n, c] + [kb.i64(0)] * len(spatial))
        kb.store(out, kb.add(kb.mul(n, c_n), c), value)


for _kind in ("avg", "max", "lp"):
    register(f"global_{_kind}_pool", "anchor", _global_infer, lower=_global_pool_lower)


def _global_converter(op: str):
    def convert(ctx, n):
        if len(ctx.type(n.inputs[0]).shape) < 3:
            raise ModelError(f"node {n.name!r} ({n.op_type}): input must have spatial "
                             f"dims, got shape {list(ctx.type(n.inputs[0]).shape)}")
        attrs = {"p": _lp_p(n)} if op == "global_lp_pool" else {}
        return [Node.make(op, n.name, n.inputs[:1], n.outputs[:1], **attrs)]
    return convert


onnx_op("GlobalAveragePool", 1)(_global_converter("global_avg_pool"))
onnx_op("GlobalMaxPool", 1)(_global_converter("global_max_pool"))
onnx_op("GlobalLpPool", 1)(_global_converter("global_lp_pool"))
