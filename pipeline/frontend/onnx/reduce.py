"""ONNX converters to the reduce operators (defined in pipeline/ops/reduce.py)."""

from __future__ import annotations

import numpy as np

from pipeline.errors import ModelError
from pipeline.frontend.onnx.registry import onnx_op
from pipeline.ir.graph import Node


def _norm_axes(n, axes, rank: int) -> tuple[int, ...]:
    out = set()
    for a in axes:
        if not -rank <= int(a) < rank:
            raise ModelError(f"node {n.name!r} ({n.op_type}): axis {int(a)} out of range "
                             f"for rank {rank}")
        out.add(int(a) % rank)
    return tuple(sorted(out))


def _reduce_converter(kind: str, axes_input: bool):
    def convert(ctx, n):
        rank = len(ctx.type(n.inputs[0]).shape)
        if axes_input:
            name = n.inputs[1] if len(n.inputs) > 1 else ""
            axes = ctx.const(name) if name else np.zeros(0, np.int64)
            if axes is None:
                raise ModelError(f"node {n.name!r} ({n.op_type}): the axes input {name!r} "
                                 "must be known at build time")
            axes = np.asarray(axes).reshape(-1).tolist()
        else:
            axes = list(n.attrs.get("axes", ()))
        if not axes:
            if n.attrs.get("noop_with_empty_axes", 0):
                return [Node.make("identity", n.name, n.inputs[:1], n.outputs[:1])]
            axes = list(range(rank))
        return [Node.make(f"reduce_{kind}", n.name, n.inputs[:1], n.outputs[:1],
                          axes=_norm_axes(n, axes, rank),
                          keepdims=int(n.attrs.get("keepdims", 1)))]
    return convert


_ONNX_NAMES = {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax",
               "min": "ReduceMin", "prod": "ReduceProd", "l1": "ReduceL1", "l2": "ReduceL2",
               "sum_square": "ReduceSumSquare", "log_sum": "ReduceLogSum",
               "log_sum_exp": "ReduceLogSumExp"}


for _kind, _onnx in _ONNX_NAMES.items():
    onnx_op(_onnx, 1, emits=(f"reduce_{_kind}", "identity"))(
        _reduce_converter(_kind, axes_input=False))
    onnx_op(_onnx, 13 if _kind == "sum" else 18, emits=(f"reduce_{_kind}", "identity"),
            build_time_inputs=(1,))(_reduce_converter(_kind, axes_input=True))


def _arg_converter(op: str):
    def convert(ctx, n):
        rank = len(ctx.type(n.inputs[0]).shape)
        (axis,) = _norm_axes(n, [n.attrs.get("axis", 0)], rank)
        return [Node.make(op, n.name, n.inputs[:1], n.outputs[:1], axis=axis,
                          keepdims=int(n.attrs.get("keepdims", 1)),
                          select_last_index=int(n.attrs.get("select_last_index", 0)))]
    return convert


onnx_op("ArgMax", 1, emits=("argmax",))(_arg_converter("argmax"))

onnx_op("ArgMin", 1, emits=("argmin",))(_arg_converter("argmin"))
