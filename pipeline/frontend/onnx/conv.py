"""ONNX converters to the conv operators (defined in pipeline/ops/conv.py)."""

from __future__ import annotations

from pipeline.errors import ModelError
from pipeline.frontend.onnx.registry import onnx_op
from pipeline.frontend.onnx.windows import lift_1d, spatial_attrs
from pipeline.ir.graph import Node


def kernel_of(n, ctx) -> tuple[int, ...]:
    """The window of an ONNX Conv/ConvTranspose node: kernel_shape, which must
    agree with the weight's trailing dims."""
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


@onnx_op("Conv", 1, emits=("conv1d", "conv2d", "conv3d"))
def _conv(ctx, n):
    x_shape = ctx.type(n.inputs[0]).shape
    kernel = kernel_of(n, ctx)
    attrs = spatial_attrs(n, x_shape, kernel)
    op = f"conv{max(2, len(kernel))}d"
    if len(kernel) == 1:
        op, attrs = "conv1d", lift_1d(attrs)
    inputs = [i for i in n.inputs if i]
    return [Node.make(op, n.name, inputs, n.outputs[:1],
                      groups=int(n.attrs.get("group", 1)), **attrs)]


@onnx_op("CausalConvWithState", 27, emits=("causal_conv", "causal_conv_state", "swish"))
def _causal_conv_with_state(ctx, n):
    """output: causal_conv (then swish for the silu/swish activation); present_state:
    causal_conv_state, the last k - 1 positions of the past state followed by x."""
    activation = n.text("activation", "none")
    if activation not in ("none", "silu", "swish"):
        raise ModelError(f"node {n.name!r} (CausalConvWithState): activation {activation!r} "
                         "is not one of none, silu, swish")
    x, w, bias, past = (*n.inputs, "", "")[:4]
    extra = [i for i in (bias, past) if i]
    flags = {"bias": int(bool(bias)), "past": int(bool(past))}
    conv_out = n.outputs[0] if activation == "none" else f"{n.outputs[0]}__conv"
    nodes = [Node.make("causal_conv", n.name, [x, w, *extra], [conv_out], **flags)]
    if activation != "none":
        nodes.append(Node.make("swish", f"{n.name}__silu", [conv_out], n.outputs[:1],
                               alpha=1.0))
    if len(n.outputs) > 1 and n.outputs[1]:
        state = ctx.type(w).shape[2] - 1
        nodes.append(Node.make("causal_conv_state", f"{n.name}__state",
                               [x, past] if past else [x], n.outputs[1:2],
                               past=flags["past"], state=state))
    return nodes
