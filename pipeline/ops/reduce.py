"""The reduce operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/reduce.py
Their ONNX converters: pipeline/frontend/onnx/reduce.py
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.geometry import FLOAT_DTYPES
from pipeline.ops.registry import OpKind, register

_INT_DTYPES = ("int64", "int32", "int8", "uint8", "int16", "uint16", "uint32")


# kind -> its numpy reduction (x, axes, keepdims)
_NUMPY = {
    "sum": lambda x, ax, kd: np.sum(x, ax, keepdims=kd),
    "mean": lambda x, ax, kd: np.mean(x, ax, keepdims=kd),
    "max": lambda x, ax, kd: np.max(x, ax, keepdims=kd),
    "min": lambda x, ax, kd: np.min(x, ax, keepdims=kd),
    "prod": lambda x, ax, kd: np.prod(x, ax, keepdims=kd),
    "l1": lambda x, ax, kd: np.sum(np.abs(x), ax, keepdims=kd),
    "l2": lambda x, ax, kd: np.sqrt(np.sum(np.square(x), ax, keepdims=kd)),
    "sum_square": lambda x, ax, kd: np.sum(np.square(x), ax, keepdims=kd),
    "log_sum": lambda x, ax, kd: np.log(np.sum(x, ax, keepdims=kd)),
    "log_sum_exp": lambda x, ax, kd: np.logaddexp.reduce(x, axis=ax, keepdims=kd),
}


def _reduce_infer(types, node):
    x = types[0]
    kind = node.op[len("reduce_"):]
    allowed = FLOAT_DTYPES + (_INT_DTYPES if kind in ("sum", "prod", "max", "min") else ()) \
        + (("bool",) if kind in ("max", "min") else ())
    if x.dtype not in allowed:
        raise ModelError(f"node {node.name!r} ({node.op}): dtype {x.dtype} is not supported "
                         f"({', '.join(allowed)} are)")
    axes = set(node.attr("axes"))
    keep = node.attr("keepdims")
    shape = tuple(1 if d in axes else s for d, s in enumerate(x.shape)
                  if keep or d not in axes)
    return [TensorType(shape, x.dtype)]


def _reduce_numpy(kind: str):
    impl = _NUMPY[kind]
    return lambda xs, node: [np.asarray(impl(xs[0], tuple(node.attr("axes")),
                                             bool(node.attr("keepdims"))))]


for _kind in _NUMPY:
    register(f"reduce_{_kind}", OpKind.ANCHOR, _reduce_infer, numpy=_reduce_numpy(_kind),
             float64=True, sample=lambda rng, dtype, k=_kind: (
                 [rng.uniform(0.1 if k == "log_sum" else -2, 2, (2, 3, 4)).astype(dtype)],
                 {"axes": (0, 2), "keepdims": 1}))


def _arg_infer(types, node):
    x = types[0]
    if x.dtype == "bool":
        raise ModelError(f"node {node.name!r} ({node.op}): bool input is not supported")
    axis = node.attr("axis")
    shape = x.shape[:axis] + ((1,) if node.attr("keepdims") else ()) + x.shape[axis + 1:]
    return [TensorType(shape, "int64")]


def _arg_numpy(fn):
    def run(xs, node):
        x, axis = xs[0], node.attr("axis")
        if node.attr("select_last_index"):  # first index of the flipped axis, mirrored
            idx = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis)
        else:
            idx = fn(x, axis=axis)
        if node.attr("keepdims"):
            idx = np.expand_dims(idx, axis)
        return [np.asarray(idx, np.int64)]
    return run


def _arg_sample(rng, dtype):  # small integers: ties, which select_last_index decides
    return [rng.integers(0, 3, (3, 4, 2)).astype(dtype)], {"axis": 1, "keepdims": 0,
                                                           "select_last_index": 1}


register("argmax", OpKind.OPAQUE, _arg_infer, numpy=_arg_numpy(np.argmax),
         float64=True, sample=_arg_sample)

register("argmin", OpKind.OPAQUE, _arg_infer, numpy=_arg_numpy(np.argmin),
         float64=True, sample=_arg_sample)
