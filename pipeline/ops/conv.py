"""Convolution: Conv and ConvTranspose, 2-D (NCHW) and 1-D (as H=1).

Graph ops: conv2d, conv1d, conv_transpose2d, conv_transpose1d. All take
(x, w[, bias]) and keep 2-D attributes (see pipeline.ops.nn); the 1-D ops run
the 2-D lowering on a (N, C, 1, W) view of the same memory.

Shapes are static, so loop bounds that depend only on kernel taps are computed
here in Python: padding never reaches the inner loops, which stay branch-free
and vectorisable.
"""

from __future__ import annotations

from pipeline.errors import ModelError
from pipeline.ir.graph import Node, TensorType
from pipeline.ops.nn import as_1d, auto_pad_of, ceil_div, lift_1d, spatial_attrs, window_out
from pipeline.ops.registry import onnx_op, register

# -- Conv -----------------------------------------------------------------------


def _conv_infer(types, node):
    x, w = types[0], types[1]
    n, c, h, wd = x.shape
    oc, icg, kh, kw = w.shape
    (sh, sw), (dh, dw) = node.attr("strides"), node.attr("dilations")
    pt, pl, pb, pr = node.attr("pads")
    groups = node.attr("groups")
    if c != icg * groups or oc % groups:
        raise ModelError(f"node {node.name!r} ({node.op}): {c} input channels do not match "
                         f"weights {list(w.shape)} with groups={groups}")
    oh, ow = window_out(h, kh, sh, pt, pb, dh), window_out(wd, kw, sw, pl, pr, dw)
    if oh < 1 or ow < 1:
        raise ModelError(f"node {node.name!r} ({node.op}): kernel {[kh, kw]} does not fit "
                         f"the padded input {list(x.shape)}")
    return [TensorType((n, oc, oh, ow), x.dtype)]


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
                oh_lo = max(0, ceil_div(pt - kh * dh, sh))
                oh_hi = min(oh_n, (h - 1 + pt - kh * dh) // sh + 1)
                for kw in range(kw_n):
                    ow_lo = max(0, ceil_div(pl - kw * dw, sw))
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
        _plane_epilogue(kb, out, plane, n, oc, epilogue)


def _plane_epilogue(kb, out, plane, n, oc, epilogue):
    """Apply `epilogue` to the finished (n, oc) output plane at offset `plane`."""
    if epilogue is None:
        return
    _, _, oh_n, ow_n = out.type.shape
    with kb.loop(0, oh_n, "eh") as oh, kb.loop(0, ow_n, "ew") as ow:
        o = kb.add(plane, kb.add(kb.mul(oh, ow_n), ow))
        kb.store(out, o, epilogue(kb.load(out, o), [n, oc, oh, ow]))


register("conv2d", "anchor", _conv_infer, lower=_conv_lower)
_conv1d_infer, _conv1d_lower = as_1d(_conv_infer, _conv_lower)
register("conv1d", "anchor", _conv1d_infer, lower=_conv1d_lower)


def _kernel_of(n, ctx) -> tuple[int, ...]:
    w_shape = ctx.type(n.inputs[1]).shape
    x_rank = len(ctx.type(n.inputs[0]).shape)
    if len(w_shape) != x_rank:
        raise ModelError(f"node {n.name!r} ({n.op_type}): weight shape {list(w_shape)} "
                         f"does not match input rank {x_rank}")
    kernel = tuple(int(k) for k in n.attrs.get("kernel_shape", w_shape[2:]))
    if kernel != tuple(w_shape[2:]):
        raise ModelError(f"node {n.name!r} ({n.op_type}): kernel_shape {list(kernel)} "
                         f"differs from weight shape {list(w_shape)}")
    return kernel


@onnx_op("Conv", 1)
def _conv(ctx, n):
    x_shape = ctx.type(n.inputs[0]).shape
    kernel = _kernel_of(n, ctx)
    attrs = spatial_attrs(n, x_shape, kernel)
    op = "conv2d"
    if len(kernel) == 1:
        op, attrs = "conv1d", lift_1d(attrs)
    inputs = [i for i in n.inputs if i]
    return [Node.make(op, n.name, inputs, n.outputs[:1],
                      groups=int(n.attrs.get("group", 1)), **attrs)]


# -- ConvTranspose ----------------------------------------------------------------

def _conv_t_infer(types, node):
    x, w = types[0], types[1]
    n, c, h, wd = x.shape
    icw, ocg, kh, kw = w.shape
    groups = node.attr("groups")
    if c != icw or c % groups:
        raise ModelError(f"node {node.name!r} ({node.op}): {c} input channels do not match "
                         f"weights {list(w.shape)} with groups={groups}")
    (sh, sw), (dh, dw) = node.attr("strides"), node.attr("dilations")
    pt, pl, pb, pr = node.attr("pads")
    oph, opw = node.attr("output_padding")
    oh = sh * (h - 1) + oph + (kh - 1) * dh + 1 - pt - pb
    ow = sw * (wd - 1) + opw + (kw - 1) * dw + 1 - pl - pr
    if oh < 1 or ow < 1:
        raise ModelError(f"node {node.name!r} ({node.op}): output size {[oh, ow]} is empty")
    return [TensorType((n, ocg * groups, oh, ow), x.dtype)]


def _conv_t_lower(kb, node, ins, out, epilogue):
    """Transposed convolution as the mirror of `_conv_lower`: per output plane,
    each input pixel is scattered to `stride` spaced outputs, tap by tap, over
    input ranges computed here so that no bounds check remains."""
    x, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    _, c, h, wd = x.type.shape
    _, ocg, kh_n, kw_n = w.type.shape
    n_n, oc_n, oh_n, ow_n = out.type.shape
    (sh, sw), (dh, dw) = node.attr("strides"), node.attr("dilations")
    pt, pl = node.attr("pads")[:2]
    icg = c // node.attr("groups")
    with kb.loop(0, n_n, "n") as n, kb.loop(0, oc_n, "oc") as oc:
        plane = kb.mul(kb.add(kb.mul(n, oc_n), oc), oh_n * ow_n)
        init = kb.load(bias, oc) if bias else kb.f32(0.0)
        with kb.loop(0, oh_n * ow_n, "p") as p:
            kb.store(out, kb.add(plane, p), init)
        group = kb.b.udiv(oc, kb.i64(ocg))
        ocl = kb.b.urem(oc, kb.i64(ocg))
        with kb.loop(0, icg, "icl") as icl:
            ic = kb.add(kb.mul(group, icg), icl)
            in_plane = kb.mul(kb.add(kb.mul(n, c), ic), h * wd)
            w_base = kb.mul(kb.add(kb.mul(ic, ocg), ocl), kh_n * kw_n)
            for kh in range(kh_n):
                # oh = ih * sh + kh * dh - pt must land in [0, oh_n)
                ih_lo = max(0, ceil_div(pt - kh * dh, sh))
                ih_hi = min(h, (oh_n - 1 + pt - kh * dh) // sh + 1)
                for kw in range(kw_n):
                    iw_lo = max(0, ceil_div(pl - kw * dw, sw))
                    iw_hi = min(wd, (ow_n - 1 + pl - kw * dw) // sw + 1)
                    if ih_lo >= ih_hi or iw_lo >= iw_hi:
                        continue
                    wv = kb.load(w, kb.add(w_base, kh * kw_n + kw))
                    with kb.loop(ih_lo, ih_hi, "ih") as ih:
                        oh = kb.add(kb.mul(ih, sh), kh * dh - pt)
                        in_row = kb.add(in_plane, kb.mul(ih, wd))
                        out_row = kb.add(plane, kb.mul(oh, ow_n))
                        with kb.loop(iw_lo, iw_hi, "iw") as iw:
                            o = kb.add(out_row, kb.add(kb.mul(iw, sw), kw * dw - pl))
                            acc = kb.fadd(kb.load(out, o),
                                          kb.fmul(wv, kb.load(x, kb.add(in_row, iw))))
                            kb.store(out, o, acc)
        _plane_epilogue(kb, out, plane, n, oc, epilogue)


register("conv_transpose2d", "anchor", _conv_t_infer, lower=_conv_t_lower)
_conv_t1d_infer, _conv_t1d_lower = as_1d(_conv_t_infer, _conv_t_lower)
register("conv_transpose1d", "anchor", _conv_t1d_infer, lower=_conv_t1d_lower)


def _ints(n, key: str, default: tuple[int, ...]) -> tuple[int, ...]:
    value = tuple(int(v) for v in n.attrs.get(key, default))
    if len(value) != len(default):
        raise ModelError(f"node {n.name!r} ({n.op_type}): {key} {list(value)} must have "
                         f"{len(default)} values")
    return value


@onnx_op("ConvTranspose", 1)
def _conv_transpose(ctx, n):
    """Resolve output_shape / auto_pad into explicit pads (ONNX ConvTranspose rules)."""
    x_shape = ctx.type(n.inputs[0]).shape
    kernel = _kernel_of(n, ctx)
    d = len(kernel)
    if d not in (1, 2):
        raise ModelError(f"node {n.name!r} (ConvTranspose): only 1-D and 2-D are supported, "
                         f"got input shape {list(x_shape)}")
    strides, dilations = _ints(n, "strides", (1,) * d), _ints(n, "dilations", (1,) * d)
    out_pad = _ints(n, "output_padding", (0,) * d)
    auto_pad = auto_pad_of(n)
    if auto_pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise ModelError(f"node {n.name!r} (ConvTranspose): unknown auto_pad {auto_pad!r} "
                         "(NOTSET, SAME_UPPER, SAME_LOWER, VALID are valid)")
    full = [s * (i - 1) + op + (k - 1) * dl + 1 for i, k, s, dl, op in
            zip(x_shape[2:], kernel, strides, dilations, out_pad, strict=True)]
    target = n.attrs.get("output_shape")
    if target is not None:
        target = tuple(int(v) for v in target)[-d:]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = tuple(i * s for i, s in zip(x_shape[2:], strides, strict=True))
    if target is not None:
        total = [f - t for f, t in zip(full, target, strict=True)]
        if auto_pad == "SAME_UPPER":
            lo, hi = [t // 2 for t in total], [t - t // 2 for t in total]
        else:
            lo, hi = [t - t // 2 for t in total], [t // 2 for t in total]
        pads = (*lo, *hi)
    elif auto_pad == "VALID":
        pads = (0,) * (2 * d)
    else:
        pads = _ints(n, "pads", (0,) * (2 * d))
    # Pads may come out negative (output_shape beyond the full size): the
    # lowering's tap ranges handle any sign, the extra outputs get only the bias.
    attrs = {"strides": strides, "dilations": dilations, "pads": tuple(pads),
             "output_padding": out_pad}
    op = "conv_transpose2d"
    if d == 1:
        op, attrs = "conv_transpose1d", lift_1d(attrs)
    inputs = [i for i in n.inputs if i]
    return [Node.make(op, n.name, inputs, n.outputs[:1],
                      groups=int(n.attrs.get("group", 1)), **attrs)]
