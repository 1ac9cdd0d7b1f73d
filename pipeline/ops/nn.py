"""Neural-network operators: Conv, BatchNormalization, pooling, Softmax (NCHW).

Shapes are static, so loop bounds that depend only on kernel taps are computed
here in Python: a convolution's padding never reaches the inner loops, which
stay branch-free and vectorisable.
"""

from __future__ import annotations

import math

from pipeline.errors import ModelError
from pipeline.ir.graph import Node, TensorType
from pipeline.ops.registry import onnx_op, register


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


def _pool_out(size: int, k: int, stride: int, pad_lo: int, pad_hi: int, dil: int,
              ceil_mode: bool = False) -> int:
    span = size + pad_lo + pad_hi - dil * (k - 1) - 1
    out = (_ceil_div(span, stride) if ceil_mode else span // stride) + 1
    # A last window that would start inside the end padding is dropped (ONNX, PyTorch).
    if ceil_mode and (out - 1) * stride >= size + pad_lo:
        out -= 1
    return out


def _spatial_attrs(n, ctx, kernel: tuple[int, int]) -> dict:
    """strides, dilations and explicit pads (top, left, bottom, right) of a 2-D window."""
    in_shape = ctx.type(n.inputs[0]).shape
    if len(in_shape) != 4 or len(kernel) != 2:
        raise ModelError(f"node {n.name!r} ({n.op_type}): only 2-D (NCHW) inputs are "
                         f"supported, got input shape {list(in_shape)}")
    strides = tuple(n.attrs.get("strides", (1, 1)))
    dilations = tuple(n.attrs.get("dilations", (1, 1)))
    auto_pad = n.attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad in ("NOTSET", ""):
        p = tuple(n.attrs.get("pads", (0, 0, 0, 0)))
        pads = (p[0], p[1], p[2], p[3])
    elif auto_pad == "VALID":
        pads = (0, 0, 0, 0)
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        lo, hi = [], []
        for size, k, s, d in zip(in_shape[2:], kernel, strides, dilations, strict=True):
            total = max(0, (_ceil_div(size, s) - 1) * s + (k - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            lo.append(small if auto_pad == "SAME_UPPER" else big)
            hi.append(big if auto_pad == "SAME_UPPER" else small)
        pads = (lo[0], lo[1], hi[0], hi[1])
    else:
        raise ModelError(f"node {n.name!r} ({n.op_type}): unknown auto_pad {auto_pad!r}")
    return {"strides": strides, "dilations": dilations, "pads": pads}


# -- Conv -----------------------------------------------------------------------

def _conv_infer(types, node):
    x, w = types[0], types[1]
    n, c, h, wd = x.shape
    oc, icg, kh, kw = w.shape
    (sh, sw), (dh, dw) = node.attr("strides"), node.attr("dilations")
    pt, pl, pb, pr = node.attr("pads")
    if c != icg * node.attr("groups"):
        raise ModelError(f"node {node.name!r} (conv2d): {c} input channels do not match "
                         f"weights {list(w.shape)} with groups={node.attr('groups')}")
    return [TensorType((n, oc, _pool_out(h, kh, sh, pt, pb, dh),
                        _pool_out(wd, kw, sw, pl, pr, dw)), x.dtype)]


def _conv_lower(kb, node, ins, out, epilogue):
    """Direct convolution, one output-channel plane at a time.

    The plane is initialised with the bias, accumulated tap by tap (the input
    row segment that a tap reads is computed here, so the inner `ow` loop has
    no bounds checks), and finished by the epilogue while it is still in cache.
    """
    x, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    _, c, h, wd = x.type.shape
    oc_n, icg, kh_n, kw_n = w.type.shape
    n_n, _, oh_n, ow_n = out.type.shape
    (sh, sw), (dh, dw) = node.attr("strides"), node.attr("dilations")
    pt, pl = node.attr("pads")[:2]
    ocg = oc_n // node.attr("groups")
    with kb.loop(0, n_n, "n") as n, kb.loop(0, oc_n, "oc") as oc:
        plane = kb.mul(kb.add(kb.mul(n, oc_n), oc), oh_n * ow_n)
        init = kb.load(bias, oc) if bias else kb.f32(0.0)
        with kb.loop(0, oh_n * ow_n, "p") as p:
            kb.store(out, kb.add(plane, p), init)
        group = kb.b.udiv(oc, kb.i64(ocg))
        with kb.loop(0, icg, "icl") as icl:
            ic = kb.add(kb.mul(group, icg), icl)
            in_plane = kb.mul(kb.add(kb.mul(n, c), ic), h * wd)
            w_base = kb.mul(kb.add(kb.mul(oc, icg), icl), kh_n * kw_n)
            for kh in range(kh_n):
                oh_lo = max(0, _ceil_div(pt - kh * dh, sh))
                oh_hi = min(oh_n, (h - 1 + pt - kh * dh) // sh + 1)
                for kw in range(kw_n):
                    ow_lo = max(0, _ceil_div(pl - kw * dw, sw))
                    ow_hi = min(ow_n, (wd - 1 + pl - kw * dw) // sw + 1)
                    if oh_lo >= oh_hi or ow_lo >= ow_hi:
                        continue
                    wv = kb.load(w, kb.add(w_base, kh * kw_n + kw))
                    with kb.loop(oh_lo, oh_hi, "oh") as oh:
                        ih = kb.add(kb.mul(oh, sh), kh * dh - pt)
                        in_row = kb.add(in_plane, kb.mul(ih, wd))
                        out_row = kb.add(plane, kb.mul(oh, ow_n))
                        with kb.loop(ow_lo, ow_hi, "ow") as ow:
                            iw = kb.add(kb.mul(ow, sw), kw * dw - pl)
                            o = kb.add(out_row, ow)
                            acc = kb.fadd(kb.load(out, o),
                                          kb.fmul(wv, kb.load(x, kb.add(in_row, iw))))
                            kb.store(out, o, acc)
        if epilogue is not None:
            with kb.loop(0, oh_n, "eh") as oh, kb.loop(0, ow_n, "ew") as ow:
                o = kb.add(plane, kb.add(kb.mul(oh, ow_n), ow))
                kb.store(out, o, epilogue(kb.load(out, o), [n, oc, oh, ow]))


register("conv2d", "anchor", _conv_infer, lower=_conv_lower)


@onnx_op("Conv", 1)
def _conv(ctx, n):
    w_type = ctx.type(n.inputs[1])
    kernel = tuple(n.attrs.get("kernel_shape", w_type.shape[2:]))
    attrs = _spatial_attrs(n, ctx, kernel)
    inputs = [i for i in n.inputs if i]
    return [Node.make("conv2d", n.name, inputs, n.outputs[:1],
                      groups=int(n.attrs.get("group", 1)), **attrs)]


# -- BatchNormalization (rewritten to scale and shift by SimplifyInference) --------

register("batch_norm", "opaque", lambda types, node: [types[0]])


@onnx_op("BatchNormalization", 1)
def _batch_norm(ctx, n):
    if len([o for o in n.outputs if o]) > 1 or n.attrs.get("training_mode", 0):
        raise ModelError(f"node {n.name!r} (BatchNormalization): training mode "
                         "(running statistics outputs) is not supported")
    return [Node.make("batch_norm", n.name, n.inputs[:5], n.outputs[:1],
                      epsilon=float(n.attrs.get("epsilon", 1e-5)))]


# -- pooling ---------------------------------------------------------------------

def _pool_infer(types, node):
    n, c, h, w = types[0].shape
    (kh, kw), (sh, sw), (dh, dw) = node.attr("kernel"), node.attr("strides"), \
        node.attr("dilations")
    pt, pl, pb, pr = node.attr("pads")
    ceil = bool(node.attr("ceil_mode", 0))
    return [TensorType((n, c, _pool_out(h, kh, sh, pt, pb, dh, ceil),
                        _pool_out(w, kw, sw, pl, pr, dw, ceil)), types[0].dtype)]


def _pool_lower(kb, node, ins, out, epilogue):
    """Max or average over each window; taps outside the input are skipped with
    a select on a clamped (always in-bounds) load."""
    x = ins[0]
    is_max = node.op == "max_pool2d"
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
                acc = b.select(ok, kb.fadd(acc, v), acc)
                counted = ok
                if include_pad:
                    counted = b.and_(pad_h, b.and_(b.icmp_signed(">=", iw, kb.i64(-pl)),
                                                   b.icmp_signed("<", iw, kb.i64(w + pr))))
                count = b.select(counted, kb.fadd(count, kb.f32(1.0)), count)
        if not is_max:
            acc = kb.fdiv(acc, kb.fmax(count, kb.f32(1.0)))
        if epilogue is not None:
            acc = epilogue(acc, [n, c, oh, ow])
        kb.store(out, kb.dot([n, c, oh, ow], out.strides), acc)


def _clamp(kb, v, size):
    b = kb.b
    low = b.select(b.icmp_signed("<", v, kb.i64(0)), kb.i64(0), v)
    return b.select(b.icmp_signed(">=", low, kb.i64(size)), kb.i64(size - 1), low)


register("max_pool2d", "anchor", _pool_infer, lower=_pool_lower)
register("avg_pool2d", "anchor", _pool_infer, lower=_pool_lower)


def _pool_converter(op):
    def convert(ctx, n):
        if len([o for o in n.outputs if o]) > 1:
            raise ModelError(f"node {n.name!r} ({n.op_type}): the Indices output "
                             "is not supported")
        kernel = tuple(n.attrs["kernel_shape"])
        attrs = _spatial_attrs(n, ctx, kernel)
        return [Node.make(op, n.name, n.inputs[:1], n.outputs[:1], kernel=kernel,
                          ceil_mode=int(n.attrs.get("ceil_mode", 0)),
                          count_include_pad=int(n.attrs.get("count_include_pad", 0)),
                          **attrs)]
    return convert


onnx_op("MaxPool", 1)(_pool_converter("max_pool2d"))
onnx_op("AveragePool", 1)(_pool_converter("avg_pool2d"))


def _global_pool_lower(kb, node, ins, out, epilogue):
    x = ins[0]
    n_n, c_n, h, w = x.type.shape
    with kb.loop(0, n_n, "n") as n, kb.loop(0, c_n, "c") as c:
        base = kb.mul(kb.add(kb.mul(n, c_n), c), h * w)
        acc = kb.local(kb.f32(0.0))
        with kb.loop(0, h * w, "p") as p:
            kb.set(acc, kb.fadd(kb.get(acc), kb.load(x, kb.add(base, p))))
        mean = kb.fmul(kb.get(acc), kb.f32(1.0 / (h * w)))
        if epilogue is not None:
            mean = epilogue(mean, [n, c, kb.i64(0), kb.i64(0)])
        kb.store(out, kb.add(kb.mul(n, c_n), c), mean)


register("global_avg_pool2d", "anchor",
         lambda types, node: [TensorType(types[0].shape[:2] + (1, 1), types[0].dtype)],
         lower=_global_pool_lower)


@onnx_op("GlobalAveragePool", 1)
def _global_avg_pool(ctx, n):
    if len(ctx.type(n.inputs[0]).shape) != 4:
        raise ModelError(f"node {n.name!r} (GlobalAveragePool): only 4-D inputs supported")
    return [Node.make("global_avg_pool2d", n.name, n.inputs[:1], n.outputs[:1])]


# -- Softmax ------------------------------------------------------------------------

def _softmax_lower(kb, node, ins, out, epilogue):
    """Rows of length L with stride `inner`: max, sum of exp, scale."""
    shape = ins[0].type.shape
    axis = node.attr("axis")
    outer = math.prod(shape[:axis])
    if node.attr("flatten"):
        length, inner = math.prod(shape[axis:]), 1
    else:
        length, inner = shape[axis], math.prod(shape[axis + 1:])
    x = ins[0]
    with kb.loop(0, outer, "r") as r, kb.loop(0, inner, "q") as q:
        base = kb.add(kb.mul(r, length * inner), q)
        slot = kb.local(kb.f32(-math.inf))
        with kb.loop(0, length, "k") as k:
            kb.set(slot, kb.fmax(kb.get(slot), kb.load(x, kb.add(base, kb.mul(k, inner)))))
        peak = kb.get(slot)
        kb.set(slot, kb.f32(0.0))
        with kb.loop(0, length, "k") as k:
            o = kb.add(base, kb.mul(k, inner))
            e = kb.intrinsic("exp", kb.fsub(kb.load(x, o), peak))
            kb.store(out, o, e)
            kb.set(slot, kb.fadd(kb.get(slot), e))
        scale = kb.fdiv(kb.f32(1.0), kb.get(slot))
        with kb.loop(0, length, "k") as k:
            o = kb.add(base, kb.mul(k, inner))
            kb.store(out, o, kb.fmul(kb.load(out, o), scale))


register("softmax", "opaque", lambda types, node: [types[0]], lower=_softmax_lower)


def _softmax_converter(flatten: bool, default_axis: int):
    def convert(ctx, n):
        rank = len(ctx.type(n.inputs[0]).shape)
        axis = int(n.attrs.get("axis", default_axis))
        if not -rank <= axis < rank:
            raise ModelError(f"node {n.name!r} (Softmax): axis {axis} out of range "
                             f"for rank {rank}")
        return [Node.make("softmax", n.name, n.inputs[:1], n.outputs[:1],
                          axis=axis % rank, flatten=int(flatten))]
    return convert


# Before opset 13 Softmax flattened the input to 2-D at `axis` (default 1).
onnx_op("Softmax", 1)(_softmax_converter(flatten=True, default_axis=1))
onnx_op("Softmax", 13)(_softmax_converter(flatten=False, default_axis=-1))
