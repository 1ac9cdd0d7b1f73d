"""ONNX converters to the pool operators (defined in pipeline/ops/pool.py)."""

from __future__ import annotations

from pipeline.errors import ModelError
from pipeline.frontend.onnx.registry import Limit, onnx_op
from pipeline.frontend.onnx.windows import lift_1d, spatial_attrs
from pipeline.ir.graph import Node


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
        op = f"{kind}_pool{max(2, len(kernel))}d"
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


onnx_op("MaxPool", 1, emits=("max_pool1d", "max_pool2d", "max_pool3d"),
        limits=(Limit("the Indices output", lambda n: len(n.outputs) > 1),))(_pool_converter("max"))

onnx_op("AveragePool", 1, emits=("avg_pool1d", "avg_pool2d", "avg_pool3d"))(_pool_converter("avg"))

onnx_op("LpPool", 1, emits=("lp_pool1d", "lp_pool2d", "lp_pool3d"))(_pool_converter("lp"))


def _global_converter(op: str):
    def convert(ctx, n):
        if len(ctx.type(n.inputs[0]).shape) < 3:
            raise ModelError(f"node {n.name!r} ({n.op_type}): input must have spatial "
                             f"dims, got shape {list(ctx.type(n.inputs[0]).shape)}")
        attrs = {"p": _lp_p(n)} if op == "global_lp_pool" else {}
        return [Node.make(op, n.name, n.inputs[:1], n.outputs[:1], **attrs)]
    return convert


onnx_op("GlobalAveragePool", 1, emits=("global_avg_pool",))(_global_converter("global_avg_pool"))

onnx_op("GlobalMaxPool", 1, emits=("global_max_pool",))(_global_converter("global_max_pool"))

onnx_op("GlobalLpPool", 1, emits=("global_lp_pool",))(_global_converter("global_lp_pool"))
