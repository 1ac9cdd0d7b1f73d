"""ONNX converters to the scan operators (defined in pipeline/ops/scan.py)."""

from __future__ import annotations

import numpy as np

from pipeline.errors import ModelError
from pipeline.frontend.onnx.elementwise import unsigned_inputs
from pipeline.frontend.onnx.registry import onnx_op
from pipeline.frontend.onnx.shape import const_or_runtime, need_const, norm_axis
from pipeline.frontend.onnx.symbolic import symbolic_dims
from pipeline.ir.graph import Node


def _cumulative_converter(op: str):
    def convert(ctx, n):
        axis = need_const(ctx, n, 1, "the axis input")
        if axis is None:
            raise ModelError(f"node {n.name!r} ({n.op_type}): the axis input is required")
        rank = len(ctx.type(n.inputs[0]).shape)
        return [Node.make(op, n.name, n.inputs[:1], n.outputs[:1],
                          axis=norm_axis(n, int(axis.reshape(-1)[0]), rank),
                          exclusive=int(n.attrs.get("exclusive", 0)),
                          reverse=int(n.attrs.get("reverse", 0)))]
    return convert


onnx_op("CumSum", 11, emits=("cumsum",), build_time_inputs=(1,))(_cumulative_converter("cumsum"))

onnx_op("CumProd", 26, emits=("cumprod",), build_time_inputs=(1,))(_cumulative_converter("cumprod"))


@onnx_op("TopK", 1, emits=("topk_values", "topk_indices"), build_time_inputs=(1,))
def _topk(ctx, n):
    """A constant K is an attribute; a runtime one (opset 10+) an input the VM reads
    (the outputs then hold their bound, the axis length: pipeline/ops/dynamic.py).
    K stays a build-time input for the ONNX backend, which freezes it: its readers
    may be static kernels (as for Range, ConstantOfShape and Expand)."""
    rank = len(ctx.type(n.inputs[0]).shape)
    inputs = tuple(n.inputs[:1])
    if n.opset >= 10:
        k = const_or_runtime(ctx, n.inputs[1], n)
        inputs = inputs if k is not None else tuple(n.inputs[:2])
        k = -1 if k is None else int(np.asarray(k).reshape(-1)[0])
    else:
        k = int(n.attrs["k"])
    attrs = {"axis": norm_axis(n, int(n.attrs.get("axis", -1)), rank), "k": k,
             "largest": int(n.attrs.get("largest", 1)), **unsigned_inputs(ctx, n.inputs[:1])}
    return [Node.make(op, f"{n.name}__{op}" if op == "topk_indices" else n.name,
                      inputs, (out,), **attrs)
            for op, out in zip(("topk_values", "topk_indices"), n.outputs, strict=False)
            if out]


@onnx_op("Trilu", 14, emits=("trilu",), build_time_inputs=(1,))
def _trilu(ctx, n):
    k = ctx.const(n.inputs[1], True) if len(n.inputs) > 1 and n.inputs[1] else None
    if k is not None and k.dtype == object:  # symbolic.py: the kernel computes k
        return [Node.make("trilu", n.name, n.inputs[:1], n.outputs[:1], k=0,
                          dims=symbolic_dims(k)[:1], upper=int(n.attrs.get("upper", 1)))]
    k = need_const(ctx, n, 1, "the k input")
    return [Node.make("trilu", n.name, n.inputs[:1], n.outputs[:1],
                      k=0 if k is None else int(np.asarray(k).reshape(-1)[0]),
                      upper=int(n.attrs.get("upper", 1)))]
