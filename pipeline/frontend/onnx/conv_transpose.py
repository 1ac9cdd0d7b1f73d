"""ONNX converters to the conv_transpose operators (defined in pipeline/ops/conv_transpose.py)."""

from __future__ import annotations

from pipeline.errors import ModelError
from pipeline.frontend.onnx.conv import kernel_of
from pipeline.frontend.onnx.registry import onnx_op
from pipeline.frontend.onnx.windows import auto_pad_of, lift_1d
from pipeline.ir.graph import Node


def _ints(n, key: str, default: tuple[int, ...]) -> tuple[int, ...]:
    value = tuple(int(v) for v in n.attrs.get(key, default))
    if len(value) != len(default):
        raise ModelError(f"node {n.name!r} ({n.op_type}): {key} {list(value)} must have "
                         f"{len(default)} values")
    return value


@onnx_op("ConvTranspose", 1, emits=("conv_transpose1d", "conv_transpose2d",
                                        "conv_transpose3d"))
def _conv_transpose(ctx, n):
    """Resolve output_shape / auto_pad into explicit pads (ONNX ConvTranspose rules)."""
    x_shape = ctx.type(n.inputs[0]).shape
    kernel = kernel_of(n, ctx)
    d = len(kernel)
    if d not in (1, 2, 3):
        raise ModelError(f"node {n.name!r} (ConvTranspose): only 1-D, 2-D and 3-D are "
                         f"supported, got input shape {list(x_shape)}")
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
    op = f"conv_transpose{max(2, d)}d"
    if d == 1:
        op, attrs = "conv_transpose1d", lift_1d(attrs)
    inputs = [i for i in n.inputs if i]
    return [Node.make(op, n.name, inputs, n.outputs[:1],
                      groups=int(n.attrs.get("group", 1)), **attrs)]
